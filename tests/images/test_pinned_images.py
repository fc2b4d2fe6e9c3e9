"""Every image reference the project emits or builds from is pinned, and so is every package.

Images: the constants of planner/images.py, every `image` in the objects the renderer produces for
the golden scenarios, the operator image of the Helm chart (values and templates, when charts/
exists), and in images/*/Dockerfile every FROM, `--from=` and `# syntax=` frontend. Pinned means a
digest, or a tag holding an exact version (x.y.z) that is not a floating name like latest/main.
Packages in the Dockerfiles: pip installs only `name==version`, local wheels, a bare name that a
`-c` file of the same command pins, or requirement files whose every line is `==` (with hashes when
--require-hashes); apt installs only `name=version`;
git sources (ADD ...git#ref) only at a full commit hash.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kimik3_operator.planner import images
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import rendered

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
CHARTS = sorted(p.parent for p in (ROOT / "charts").glob("*/Chart.yaml"))
PROJECT_IMAGES = {images.CUDA_IMAGE, images.ROCM_IMAGE, images.ROUTER_IMAGE, images.OPERATOR_IMAGE}
ARCHES = ("amd64", "arm64")  # the TARGETARCH values the images are built for

FLOATING_TAGS = {"latest", "main", "master", "stable", "edge", "nightly", "dev", "head", "rolling"}
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
EXACT_VERSION = re.compile(r"\d+\.\d+\.\d+")
PINNED_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")


def pin_problem(ref: str) -> str | None:
    """Why `ref` is not pinned, or None when it is."""
    if "$" in ref or "{" in ref:
        return "has an unresolved variable"
    if DIGEST.search(ref):
        return None
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # no colon at all, or only a registry port's
        return "has no tag (means latest)"
    if tag.lower() in FLOATING_TAGS:
        return f"has the floating tag {tag!r}"
    if not EXACT_VERSION.search(tag):
        return f"tag {tag!r} holds no exact x.y.z version"
    return None


# ---------------------------------------------------------------- what the renderer emits


def image_values(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from image_values(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from image_values(item)


def rendered_images() -> dict[str, str]:
    """image -> where it was seen, over every golden scenario's rendered objects and plan."""
    found: dict[str, str] = {}
    for scenario in sorted(SCENARIOS):
        for filename, text in rendered(scenario).items():
            doc = json.loads(text) if filename.endswith(".json") else yaml.safe_load(text)
            for image in image_values(doc):
                found.setdefault(image, f"{scenario}/{filename}")
    return found


def test_planner_images_are_pinned() -> None:
    for ref in (*PROJECT_IMAGES, images.serving_image(None)):
        assert pin_problem(ref) is None, f"{ref} {pin_problem(ref)}"


def test_rendered_images_are_pinned_and_built_here() -> None:
    found = rendered_images()
    assert found, "the golden scenarios render no image at all"
    for image, where in found.items():
        assert pin_problem(image) is None, f"{where}: {image} {pin_problem(image)}"
        if image.startswith(images.IMAGE_REPOSITORY + "/"):
            assert image in PROJECT_IMAGES, f"{where}: {image} is not one of the images built from images/"


# ---------------------------------------------------------------- the Helm chart (when present)


def chart_images(chart: Path) -> Iterator[tuple[str, str]]:
    """(image, where) from values*.yaml (image: str, or {registry, repository, tag, digest}) and
    from literal `image:` lines of the templates (templated ones come from the values)."""
    app_version = str(yaml.safe_load((chart / "Chart.yaml").read_text()).get("appVersion", ""))

    def from_values(obj: Any, where: str) -> Iterator[tuple[str, str]]:
        if isinstance(obj, dict):
            for key, value in obj.items():
                if key == "image" and isinstance(value, str) and value:
                    yield value, where
                elif key == "image" and isinstance(value, dict) and value.get("repository"):
                    # An empty tag is the templates' `default .Chart.AppVersion`.
                    ref = "/".join(filter(None, [value.get("registry"), value["repository"]]))
                    ref += ":" + str(value.get("tag") or app_version) if (value.get("tag") or app_version) else ""
                    ref += "@" + value["digest"] if value.get("digest") else ""
                    yield ref, where
                else:
                    yield from from_values(value, where)
        elif isinstance(obj, list):
            for item in obj:
                yield from from_values(item, where)

    for values in sorted(chart.rglob("values*.yaml")):
        yield from from_values(yaml.safe_load(values.read_text()), str(values.relative_to(ROOT)))
    for template in sorted((chart / "templates").rglob("*")):
        if template.suffix not in {".yaml", ".yml", ".tpl"}:
            continue
        for number, line in enumerate(template.read_text().splitlines(), 1):
            match = re.match(r"^\s*-?\s*image:\s*(\S.*)$", line)
            if match and "{{" not in match.group(1):
                yield match.group(1).strip().strip("\"'"), f"{template.relative_to(ROOT)}:{number}"


@pytest.mark.skipif(not CHARTS, reason="no charts/ in this tree")
def test_chart_images_are_pinned() -> None:
    found = [item for chart in CHARTS for item in chart_images(chart)]
    assert found, "the chart names no image"
    for image, where in found:
        assert pin_problem(image) is None, f"{where}: {image} {pin_problem(image)}"


@pytest.mark.skipif(not (ROOT / "charts/kimik3-operator").exists(), reason="no operator chart in this tree")
def test_chart_deploys_the_operator_image_built_here() -> None:
    refs = {image for image, _ in chart_images(ROOT / "charts/kimik3-operator")}
    assert images.OPERATOR_IMAGE in refs, f"chart images {sorted(refs)} lack {images.OPERATOR_IMAGE}"


# ---------------------------------------------------------------- the Dockerfiles


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in dockerfile.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        result.append((keyword.upper(), rest.strip()))
        pending = ""
    return result


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def arg_defaults(steps: list[tuple[str, str]], *, global_only: bool) -> dict[str, str]:
    args: dict[str, str] = {}
    for keyword, rest in steps:
        if keyword == "FROM" and global_only:
            break
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value.strip("\"'")
    return args


def dockerfile_images(dockerfile: Path) -> Iterator[str]:
    steps = instructions(dockerfile)
    syntax = re.match(r"#\s*syntax\s*=\s*(\S+)", dockerfile.read_text())
    if syntax:
        yield syntax.group(1)
    global_args = arg_defaults(steps, global_only=True)
    stages = {"scratch"}
    for keyword, rest in steps:
        words = [w for w in rest.split() if not w.startswith("--platform")]
        if keyword == "FROM":
            image = expand(words[0], global_args)
            if image not in stages:
                yield image
            if len(words) == 3 and words[1].upper() == "AS":
                stages.add(words[2])
        for source in re.findall(r"(?:^|\s|,)--from=(\S+?)(?=[\s,]|$)|(?:,|\s)from=([^,\s]+)", rest):
            name = source[0] or source[1]
            if name not in stages:
                yield name


def shell_commands(run: str) -> Iterator[list[str]]:
    """The simple commands of a RUN line, as words."""
    body = re.sub(r"^(--\S+\s+)+", "", run)  # RUN --mount=... options
    for command in re.split(r"&&|\|\||;|\|", body):
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]  # VAR=value prefixes
        if words:
            yield words


def copied_files(steps: list[tuple[str, str]]) -> dict[str, str]:
    """Destination in the image -> source in the build context, for plain COPY lines."""
    copies: dict[str, str] = {}
    for keyword, rest in steps:
        words = rest.split()
        if keyword != "COPY" or any(w.startswith("--from") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        *sources, dest = paths
        for source in sources:
            copies[dest.rstrip("/") + "/" + Path(source).name if dest.endswith("/") else dest] = source
    return copies


def pinned_versions(path: Path) -> dict[str, str]:
    """Canonical name -> version of the ``name==version`` lines of a requirement or constraints file."""
    return {canonicalize_name(m.group(1)): m.group(2)
            for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", path.read_text(), re.MULTILINE)}


def requirement_file_problems(path: Path, *, hashes: bool) -> list[str]:
    problems = []
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("--hash") else line
        if not line:
            continue
        requirement, *options = line.split()
        if not PINNED_REQUIREMENT.match(requirement):
            problems.append(f"{path.name}: {requirement!r} is not name==version")
        elif hashes and not any(o.startswith("--hash=sha256:") for o in options):
            problems.append(f"{path.name}: {requirement} has no --hash")
    return problems


def package_problems(dockerfile: Path) -> Iterator[str]:
    steps = instructions(dockerfile)
    args = arg_defaults(steps, global_only=False)
    context = ROOT if dockerfile.parent.name == "operator" else dockerfile.parent
    copies = copied_files(steps)
    for keyword, rest in steps:
        if keyword == "ADD":
            for url in re.findall(r"\S+\.git(?:#\S*)?", expand(rest, args)):
                if not re.search(r"#[0-9a-f]{40}$", url):
                    yield f"ADD {url}: a git source must name a full commit hash"
        if keyword != "RUN":
            continue
        for words in shell_commands(expand(rest, {k: v for k, v in args.items() if k != "TARGETARCH"})):
            if words[:2] == ["apt-get", "install"] or words[:2] == ["apt", "install"]:
                for word in words[2:]:
                    if not word.startswith("-") and "=" not in word:
                        yield f"apt-get install {word}: no =version"
            if "install" not in words or not any(w in ("pip", "pip3") or w.endswith("/pip") for w in words):
                continue
            packages = words[words.index("install") + 1:]
            require_hashes = "--require-hashes" in packages
            constrained: set[str] = set()  # names a -c file of this command pins
            i = 0
            while i < len(packages):
                word = packages[i]
                if word in ("-r", "--requirement", "-c", "--constraint"):
                    source = copies.get(packages[i + 1])
                    if source is None:
                        yield f"pip install {word} {packages[i + 1]}: not a file COPY'd from the build context"
                    for arch in ARCHES:
                        path = context / source.replace("${TARGETARCH}", arch) if source else None
                        if path is not None and not path.is_file():
                            yield f"pip {word} {path}: missing"
                        elif path is not None:
                            yield from requirement_file_problems(path, hashes=require_hashes and word.startswith("-r"))
                            if word in ("-c", "--constraint"):
                                constrained |= set(pinned_versions(path))
                    i += 2
                    continue
                if word in ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-t", "--target"):
                    i += 2
                    continue
                if (not word.startswith("-") and not word.endswith(".whl") and not PINNED_REQUIREMENT.match(word)
                        and canonicalize_name(word) not in constrained):
                    yield f"pip install {word}: not name==version (nor a local wheel, nor pinned by a -c file)"
                i += 1


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_bases_are_pinned(dockerfile: Path) -> None:
    found = list(dockerfile_images(dockerfile))
    assert found, f"{dockerfile}: no FROM"
    for image in found:
        assert pin_problem(image) is None, f"{dockerfile.relative_to(ROOT)}: {image} {pin_problem(image)}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_packages_are_pinned(dockerfile: Path) -> None:
    problems = list(package_problems(dockerfile))
    assert not problems, f"{dockerfile.relative_to(ROOT)}:\n" + "\n".join(problems)


def runtime_closure() -> set[str]:
    """Every package the operator's wheel pulls in, transitively (this venv's markers: Linux, 3.11)."""
    todo, seen = ["kimik3-operator"], set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.distribution(name).requires or []:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen - {"kimik3-operator"}


def test_constraints_pin_the_operators_whole_runtime_closure() -> None:
    """CI installs the operator with -c constraints.txt: every package it pulls in, transitively,
    must be pinned there, or that package would float."""
    missing = sorted(runtime_closure() - set(pinned_versions(ROOT / "constraints.txt")))
    assert not missing, f"constraints.txt does not pin {missing}"


@pytest.mark.parametrize("arch", ARCHES)
def test_the_operator_image_lock_is_what_ci_tests(arch: str) -> None:
    """The operator image installs images/operator/requirements-<arch>.txt with --require-hashes
    --no-deps: it must hold the wheel's whole runtime closure, nothing else, at constraints.txt's
    versions (re-lock with `python images/lock.py operator` after changing either)."""
    lock = pinned_versions(ROOT / f"images/operator/requirements-{arch}.txt")
    constraints = pinned_versions(ROOT / "constraints.txt")
    closure = runtime_closure()
    assert set(lock) == closure, f"locked only: {sorted(set(lock) - closure)}, unlocked: {sorted(closure - set(lock))}"
    differ = {name: (version, constraints.get(name)) for name, version in lock.items()
              if constraints.get(name) != version}
    assert not differ, f"lock version != constraints.txt version: {differ}"


# ---------------------------------------------------------------- the checks themselves


@pytest.mark.parametrize(("ref", "pinned"), [
    ("nvidia/cuda:13.0.2-devel-ubuntu24.04", True),
    ("python:3.11.17-slim-bookworm", True),
    ("ghcr.io/kimik3-operator/vllm-serving:0.33.0-cuda", True),
    ("registry:5000/x/y@sha256:" + "a" * 64, True),
    ("python", False),
    ("python:latest", False),
    ("python:3.11-slim", False),
    ("registry:5000/x/y", False),
    ("ghcr.io/x/y:main", False),
    ("${BASE}", False),
])
def test_pin_rule(ref: str, pinned: bool) -> None:
    assert (pin_problem(ref) is None) == pinned
