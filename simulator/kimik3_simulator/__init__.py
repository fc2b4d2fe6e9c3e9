"""A Kimi K3 engine simulator: a stand-in for a vLLM 0.33.0 serving pod where no GPU runs it (e2e on kwok).

It reads the `vllm serve` command line the operator renders (cmdline.py) and serves what vLLM
serves on it: the OpenAI completion and chat routes (streaming and not, tool calls), /v1/models,
/health and /metrics with vLLM's own metric families (metrics.py), the NIXL P/D hand-off
protocol over a real side channel with the prefill's KV lease and single read (nixl.py), faults
beyond SIGKILL for tests (faults.py, docs/simulator-faults.md), and what a router asks the
frontend around generation: /tokenize, /detokenize, the scale-out /render paths and
X-data-parallel-rank, as the pod's frontend (Rust or Python) answers them (frontend.py,
vocab.py). Its timing comes from the planner's performance model (timing.py) through a
continuous-batching step loop (engine.py), so TTFT, inter-token latency, DSpark's tokens per step
and prefix-cache hits are the ones the planner predicts.
`/sim/stats` tells tests which requests were prefilled where. Entry point:
`python -m kimik3_simulator vllm serve ...`.

It imports only the pure layers (kimi_k3, planner, api, contract), never kopf, the Kubernetes
client or the renderer (import-linter contract).
"""
