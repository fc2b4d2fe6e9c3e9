"""Where each checkpoint is staged and how serving pods find it.

The model and the DSpark draft are staged once per (uri, revision) by a Job into a folder of the
cache volume, before any serving pod starts; serving pods mount that folder read-only at the fixed
path vLLM is given (the path enters NIXL's compatibility hash, so it never varies). A new revision
stages into a new folder while the old one keeps serving, so a running engine never sees its files
replaced. `pvc://claim/path` checkpoints are verified in place on the user's claim.

A branch resolves to a commit only when it is staged; `with_commits` puts the commits into the
plan, and so into the prefill/decode compatibility hash and the serving pods' wait condition.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..api import KimiK3DeploymentSpec
from ..contract.stager import CONTENT_COMMIT, HUB_COMMIT
from ..contract.uri import parse_model_uri
from .placement import Placement, placement

MODEL_PATH = "/models/kimi-k3"
DRAFT_PATH = "/models/kimi-k3-draft"
SourceName = Literal["model", "draft"]
CACHE_MOUNT = "/cache"
"""Where a staging Job mounts the volume it writes to."""


@dataclass(frozen=True)
class WeightsSource:
    name: SourceName
    uri: str
    revision: str
    mount_path: str
    """Where serving pods see the checkpoint (what vLLM is given)."""
    claim: str | None
    """The user's claim for pvc:// sources; None stages into the deployment's cache claim."""
    folder: str
    """Folder on the claim: the pvc:// path, or one per (source, uri, revision) on the cache."""
    commit: str | None = None
    """Resolved commit, known once staged (or at once when the revision is a commit)."""

    @property
    def key(self) -> str:
        """Stable id of what is staged, for Job names: a changed uri or revision is a new Job."""
        return hashlib.sha256(f"{self.name}\n{self.uri}\n{self.revision}".encode()).hexdigest()[:8]

    @property
    def scheme(self) -> str:
        return parse_model_uri(self.uri).scheme


@dataclass(frozen=True)
class WeightsPlan:
    sources: tuple[WeightsSource, ...]
    cache_size: str
    cache_storage_class: str | None
    auth_secret: tuple[str, str] | None
    """(Secret, key) for the staging Jobs only: serving pods read local files and get no token."""
    endpoint: str | None
    cache_retained: bool = True
    """spec.model.cache.retentionPolicy Retain: the cache claim outlives the deployment."""
    staging: Placement = field(default_factory=Placement)
    """Where the staging Jobs' pods may run (spec.model.staging.scheduling)."""

    @property
    def needs_cache(self) -> bool:
        return any(s.claim is None for s in self.sources)

    @property
    def staged(self) -> bool:
        return all(s.commit for s in self.sources)


def weights_plan(spec: KimiK3DeploymentSpec) -> WeightsPlan:
    wanted: list[tuple[SourceName, str, str, str]] = [("model", spec.model.uri, spec.model.revision, MODEL_PATH)]
    speculative = spec.engine.speculative
    if speculative and speculative.method == "DSpark" and speculative.draft_model_uri:
        # The draft has no revision field of its own: it follows its repository's main branch.
        wanted.append(("draft", speculative.draft_model_uri, "main", DRAFT_PATH))
    sources = []
    for name, uri, revision, mount in wanted:
        location = parse_model_uri(uri)  # admission let only parseable URIs through
        # Only the Hub has branches; s3:// and pvc:// stage what is there now unless pinned to
        # the content hash an earlier stage reported.
        if location.scheme != "hf" and not CONTENT_COMMIT.match(revision):
            revision = ""
        if location.scheme == "pvc":
            source = WeightsSource(name, uri, revision, mount, location.authority, location.path)
        else:
            source = WeightsSource(name, uri, revision, mount, None, "")
            source = dataclasses.replace(source, folder=f"{name}-{source.key}")
        if HUB_COMMIT.match(revision) or CONTENT_COMMIT.match(revision):
            source = dataclasses.replace(source, commit=revision)
        sources.append(source)
    cache = spec.model.cache
    auth = spec.model.auth_secret_ref
    return WeightsPlan(
        sources=tuple(sources),
        cache_size=cache.size if cache else "2Ti",
        cache_storage_class=cache.storage_class_name if cache else None,
        auth_secret=(auth.name, auth.key) if auth else None,
        endpoint=spec.model.endpoint,
        cache_retained=cache.retention_policy == "Retain" if cache else True,
        staging=placement({}, (), spec.model.staging.scheduling if spec.model.staging else None),
    )


def with_commits(weights: WeightsPlan, commits: Mapping[str, str]) -> WeightsPlan:
    """The plan with each staged source's commit filled in (sources not in `commits` keep theirs)."""
    return dataclasses.replace(weights, sources=tuple(
        dataclasses.replace(s, commit=commits.get(s.name) or s.commit) for s in weights.sources))
