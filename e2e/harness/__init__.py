"""The e2e harness: the stand-ins for what kwok cannot run (the pod runner plays serving and router
pods as their kubelet, the stager plays staging pods), the traffic and load clients, and the
kubectl helpers the e2e tests (e2e/tests) and the benches use. A typed library: it imports no test
(an import-linter contract), and mypy checks it with the rest of the project."""
