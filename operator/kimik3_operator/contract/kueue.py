"""What the operator writes for Kueue and reads back from it (Kueue v0.17.0, docs/queues.md).

A role with `queueName` has its LeaderWorkerSet labelled with the LocalQueue; Kueue's
leaderworkerset integration then makes one Workload per group (leader and workers as pod sets,
admitted whole: pkg/controller/jobs/leaderworkerset/leaderworkerset_reconciler.go) and its pod
webhook gates the group's pods until that Workload is admitted (pkg/controller/jobs/pod/pod_webhook.go).
"""

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""On the LeaderWorkerSet: the LocalQueue (pkg/controller/constants, QueueLabel)."""
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""On each Workload: the UID of the LeaderWorkerSet it admits a group of (constants.JobUIDLabel)."""
GROUP_INDEX_ANNOTATION = "kueue.x-k8s.io/component-workload-index"
"""On each Workload: the LeaderWorkerSet group it admits (constants.ComponentWorkloadIndexAnnotation)."""
ADMISSION_GATE = "kueue.x-k8s.io/admission"
"""The scheduling gate a queued group's pods carry until Kueue admits the group."""

WORKLOAD_API_VERSION = "kueue.x-k8s.io/v1beta2"
WORKLOAD_KIND = "Workload"
WORKLOAD_RESOURCE = "workloads.kueue.x-k8s.io"

ADMITTED = "Admitted"
QUOTA_RESERVED = "QuotaReserved"
FINISHED = "Finished"
EVICTED = "Evicted"
"""Workload condition types (apis/kueue/v1beta2/workload_types.go)."""
