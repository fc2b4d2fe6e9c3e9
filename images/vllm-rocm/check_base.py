"""Build-time check of what the ROCm serving image assumes about its base (see the Dockerfile):
fail the image build, not a serving pod, when an assumption is wrong."""

import importlib.metadata
import importlib.util

version = importlib.metadata.version("vllm")
assert version.split("+")[0] == "0.33.0", f"base image has vllm {version}, expected 0.33.0"
for module, needed_for in (("aiter", "--moe-backend aiter"),
                           ("rixl", "the NixlConnector (vLLM imports rixl._api on ROCm)"),
                           ("mori", "the mori_* all-to-all backends")):
    assert importlib.util.find_spec(module), f"{module} is missing from the base image: needed for {needed_for}"
print(f"vllm {version} with aiter, rixl and mori")
