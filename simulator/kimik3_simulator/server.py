"""The HTTP face of a simulated vLLM leader: the OpenAI routes, /tokenize, /detokenize and the
scale-out render paths (as the pod's frontend answers them, frontend.py), /health, /metrics and
/sim/stats.

/health answers 503 until the (scaled) startup delay has passed and again once a SIGTERM starts
the drain; requests then get 503 too, in-flight ones finish within --shutdown-timeout (0: they are
aborted at once, as vLLM does) and the process exits.

The faults of faults.py strike the engine routes here (hang, stall, 5xx, reset), and POST
/sim/fault arms them at run time when K3SIM_FAULT_ADMIN=1, for loopback peers only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .config import VLLM_VERSION, EngineConfig
from .engine import Engine, Output, QueueFull, Sequence, Submission
from .faults import ENGINE_DEAD, HANG, HTTP_5XX, RESET, STALL, Fault, FaultError, Faults, fault_from
from .frontend import RENDER_PATHS, Frontend, response_id
from .nixl import CONSUME, classify
from .openai_format import BadRequest, Envelope, Shape, error_body, sse
from .responses_format import ResponsesEnvelope, as_chat
from .stats import SimStats
from .text import Answer, PromptError, chat_answer, corrupted, prompt_seed
from .tracing import RequestTracer
from .vocab import token_id

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20
"""The simulator's own guard where vLLM has no cap (the Python frontend)."""
HOLD_POLL_SECONDS = 0.25
"""How often a held (hung or stalled) request looks whether its client is still there."""


def _error(message: str, status: int, kind: str, param: str | None = None) -> web.Response:
    return web.json_response(error_body(message, kind, status, param), status=status)


def _refused(exc: BadRequest | PromptError) -> web.Response:
    return _error(str(exc), exc.status, exc.kind, exc.param) if isinstance(exc, BadRequest) else \
        _error(str(exc), 400, "BadRequestError")


class Simulator:
    def __init__(self, config: EngineConfig, engine: Engine, stats: SimStats, faults: Faults | None = None) -> None:
        self.config = config
        self.engine = engine
        self.stats = stats
        self.faults = faults if faults is not None else Faults([], config.settings.oom_cap_bytes)
        self.frontend = Frontend(config)
        self.ready_at = 0.0
        self.draining = False
        self.created = int(time.time())
        self.tracing = RequestTracer(config.serve.otlp_traces_endpoint)

    # ---- plumbing -----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.settings.max_body_bytes or MAX_BODY_BYTES)
        app.add_routes([
            web.get("/health", self.health), web.get("/ping", self.health), web.post("/ping", self.health),
            web.get("/version", self.version), web.get("/v1/models", self.models), web.get("/metrics", self.metrics),
            web.get("/sim/stats", self.sim_stats), web.post("/sim/fault", self.sim_fault),
            web.get("/kv_event_sources", self.kv_event_sources), web.post("/sim/prefix_hits", self.prefix_hits),
            web.post("/v1/completions", self.completions), web.post("/v1/chat/completions", self.chat),
            web.post("/v1/responses", self.responses),
            *(web.post(path, self.frontend_route) for path in ("/tokenize", "/detokenize", *RENDER_PATHS)),
        ])
        return app

    def _ready(self) -> bool:
        return not self.draining and asyncio.get_running_loop().time() >= self.ready_at

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._ready() else 503)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        serve = self.config.serve
        names = serve.served_model_names or (serve.model,)
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "vllm", "root": serve.model,
             "parent": None, "max_model_len": self.config.max_model_len,
             "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                             "created": self.created, "allow_create_engine": False, "allow_sampling": True,
                             "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                             "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}]}
            for name in names]})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.engine.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def kv_event_sources(self, request: web.Request) -> web.Response:
        """Each rank's KV event publisher (vLLM's instrumentator route: {} when events are off)."""
        publisher = self.engine.publisher
        return web.json_response(publisher.sources() if publisher is not None else {})

    async def prefix_hits(self, request: web.Request) -> web.Response:
        """The true K3 hit a completions or chat body would get on each rank now, touching nothing:
        what a bench's oracle reads ({"prompt_tokens": N, "prompt_fingerprint": the key its
        /sim/stats record will carry, "hits": {rank: tokens}})."""
        try:
            body = await self._json(request)
            tokens, _ = self.frontend.prompt(body, isinstance(body.get("messages"), list))
        except (BadRequest, PromptError) as exc:
            return _refused(exc)
        ids = [token_id(t) for t in tokens]
        return web.json_response({"prompt_tokens": len(ids),
                                  "prompt_fingerprint": f"{prompt_seed(ids):016x}",  # its record's key too
                                  "hits": self.engine.prefix_hits(ids)})

    async def sim_stats(self, request: web.Request) -> web.Response:
        c = self.config
        layout = c.perf.layout
        engine = {"role": c.role, "kv_role": c.serve.kv_role, "kv_connector": c.kv_connector,
                  "engine_ids": list(c.engine_ids), "gpu": c.gpu.product,
                  "layout": {"tensor": layout.tensor, "pipeline": layout.pipeline, "data": layout.data,
                             "expert": layout.expert},
                  "crosses_rdma": c.perf.crosses_rdma, "block_size": c.perf.block_size,
                  "speculative_tokens": c.spec_tokens, "acceptance": c.acceptance,
                  "time_scale": c.settings.time_scale, "compat_hash": self.engine.nixl.compat_hash,
                  "in_flight": self.engine.in_flight, "draining": self.draining}
        return web.json_response({**self.stats.as_dict(engine), "nixl": self.engine.nixl.as_dict(),
                                  "faults": self.faults.as_dict(c.settings.fault_admin)})

    async def sim_fault(self, request: web.Request) -> web.Response:
        """Arm a fault ({"fault": kind, ...}, or a list of them; "none" clears): only with
        K3SIM_FAULT_ADMIN=1 and from a loopback peer."""
        if not self.config.settings.fault_admin:
            return _error("fault injection is off: the engine was not started with K3SIM_FAULT_ADMIN=1",
                          403, "PermissionDeniedError")
        try:
            loopback = ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            return _error("faults are armed from loopback only", 403, "PermissionDeniedError")
        try:
            body = await request.json()
            for fault in [fault_from(f) for f in (body if isinstance(body, list) else [body])]:
                self.faults.arm(fault)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("the request body is not JSON", 400, "BadRequestError")
        except FaultError as exc:
            return _error(str(exc), 400, "BadRequestError")
        return web.json_response(self.faults.as_dict(True))

    # ---- the frontend's own routes ------------------------------------------------------------

    async def _json(self, request: web.Request) -> dict[str, Any]:
        if not self._ready():
            raise BadRequest("The server is not ready" if not self.draining else "The server is shutting down",
                             503, "ServiceUnavailableError")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    async def frontend_route(self, request: web.Request) -> web.Response:
        """/tokenize, /detokenize and the render paths: JSON in, JSON out, refusals as vLLM's errors."""
        try:
            body = await self._json(request)
            if request.path in RENDER_PATHS:
                answer = self.frontend.render(request.path, body, request.headers.get("X-Request-Id"))
            else:
                answer = {"/tokenize": self.frontend.tokenize,
                          "/detokenize": self.frontend.detokenize}[request.path](body)
            return web.json_response(answer)
        except (BadRequest, PromptError) as exc:
            return _refused(exc)

    # ---- the OpenAI routes --------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API: the chat path's engine work in its own envelope (responses_format.py)."""
        return await self._serve(request, chat=True, responses=True)

    async def _serve(self, request: web.Request, *, chat: bool, responses: bool = False) -> web.StreamResponse:
        try:
            given = await self._json(request)
            body = as_chat(given) if responses else given
            sub, answer, envelope = self._submission(request, body, chat)
            shaped = ResponsesEnvelope(given, envelope.model, sub.max_tokens_param if sub.max_tokens_param is not None
                                       else self.config.max_model_len - len(sub.tokens)) if responses else None
            fault = self.faults.take()
            if fault is not None and fault.kind != STALL:
                return await self._fault(request, body, sub, fault)
            seq = self.engine.submit(sub)
        except (BadRequest, PromptError) as exc:
            return _refused(exc)
        except QueueFull as full:
            self.stats.reject(full.reason)
            return _error(f"The request queue is full ({full.reason})", 503, "ServiceUnavailableError")
        stall = fault.after_tokens if fault is not None else None
        try:
            if shaped is not None:
                if body.get("stream"):
                    return await self._stream_responses(request, seq, answer, shaped, stall)
                return await self._complete(request, seq, answer, stall, shaped.whole)
            if body.get("stream"):
                return await self._stream(request, body, seq, answer, envelope, stall)
            return await self._complete(request, seq, answer, stall, envelope.whole)
        except ConnectionResetError:  # the client went away mid-stream
            return web.Response(status=499)
        finally:
            self.engine.abort(seq)  # no-op once finished; a client gone mid-request frees its slot
            self._trace(request, seq)

    def _trace(self, request: web.Request, seq: Sequence) -> None:
        """vLLM's llm_request span of a request that finished (tracing.py), with do_tracing's
        attributes; an aborted one (the client gone, a drain) is not traced, as in vLLM."""
        if self.tracing.tracer is None or seq.aborted:
            return
        now = asyncio.get_running_loop().time()
        first = seq.first_token_at
        attributes: dict[str, Any] = {
            "gen_ai.request.id": seq.sub.key,
            "gen_ai.usage.prompt_tokens": seq.prompt_len,
            "gen_ai.usage.completion_tokens": seq.generated,
            "gen_ai.latency.e2e": now - seq.arrival,
        }
        if first is not None:
            attributes["gen_ai.latency.time_to_first_token"] = first - seq.arrival
        if seq.scheduled_at is not None:
            attributes["gen_ai.latency.time_in_queue"] = seq.scheduled_at - seq.arrival
        if seq.sub.max_tokens_param is not None:
            attributes["gen_ai.request.max_tokens"] = seq.sub.max_tokens_param
        self.tracing.finished(request.headers, time.time() - (now - seq.arrival), attributes)

    # ---- faults -------------------------------------------------------------------------------

    async def _fault(self, request: web.Request, body: dict[str, Any], sub: Submission,
                     fault: Fault) -> web.StreamResponse:
        """A request that a hang, a 5xx or a reset strikes. One that carries kv_transfer_params has
        its KV read from the prefill first, as the engine pulls it before it runs the request: the
        prefill's blocks are then freed, and a router that resends those params elsewhere makes the
        prefill count a second read."""
        self.faults.counts[fault.kind] += 1
        if sub.handoff.kind == CONSUME and sub.handoff.params is not None:
            await self.engine.nixl.consume(sub.handoff.params)
        if fault.kind == HTTP_5XX:
            return _error(ENGINE_DEAD, 500, "InternalServerError")
        if fault.kind == RESET:
            response = web.StreamResponse(status=200, headers={
                "Content-Type": "text/event-stream" if body.get("stream") else "application/json"})
            await response.prepare(request)
            await self._reset(request)
            return response
        assert fault.kind == HANG
        await self._hold(request)
        return _error("The server is shutting down", 503, "ServiceUnavailableError")

    async def _hold(self, request: web.Request) -> None:
        """Answer nothing more, with the connection open, until the client leaves or the engine stops."""
        released = self.faults.released
        while not released.is_set() and request.transport is not None and not request.transport.is_closing():
            try:
                await asyncio.wait_for(released.wait(), HOLD_POLL_SECONDS)
            except TimeoutError:
                pass

    @staticmethod
    async def _reset(request: web.Request) -> None:
        """Reset the connection (RST, not FIN) once what was written has left."""
        transport = request.transport
        if transport is None:
            return
        for _ in range(100):
            if not transport.get_write_buffer_size():
                break
            await asyncio.sleep(0.01)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()

    def _submission(self, request: web.Request, body: dict[str, Any],
                    chat: bool) -> tuple[Submission, Answer, Envelope]:
        frontend = self.frontend
        frontend.check_model(body)
        tokens, room = frontend.prompt(body, chat)
        rank = frontend.data_parallel_rank(request.headers.get("X-data-parallel-rank"))
        ids = [token_id(t) for t in tokens]
        seed = prompt_seed(ids)
        settings = self.config.settings
        plain = Answer.after(ids, settings.output_tokens, settings.thinking_tokens)
        answer = (chat_answer(body["messages"], body.get("tools"), body.get("tool_choice", "auto"), plain)
                  if chat else plain)
        param, limit, finish = self._generation(body, chat, room, answer)
        handoff = classify(body.get("kv_transfer_params"), bool(self.config.kv_connector))
        header_id = request.headers.get("X-Request-Id")
        rid = response_id(header_id, body, chat)
        sub = Submission(
            key=header_id or rid, internal_id=f"{rid}-{uuid.uuid4().hex[:8]}", tokens=tokens, ids=ids,
            fingerprint=f"{seed:016x}", max_tokens_param=param, limit=limit, finish_at_limit=finish, handoff=handoff,
            rank=rank)
        split = self.config.serve.reasoning_parser == "kimi_k3" and body.get("include_reasoning") is not False
        shape = Shape(token_ids=body.get("return_token_ids") is True,
                      skip_special=body.get("skip_special_tokens") is not False, reasoning=split, prompt_ids=tuple(ids))
        return sub, answer, Envelope(rid, body.get("model") or frontend.model_names[0], chat, shape)

    def _generation(self, body: dict[str, Any], chat: bool, room: int, answer: Answer) -> tuple[int | None, int, str]:
        """(the max_tokens the request gave, tokens it will get, why it stops): max_tokens (chat:
        max_completion_tokens first) or the room left in max_model_len, the answer's own length
        unless ignore_eos, at least min_tokens."""
        param = self.frontend.max_tokens(body, chat, room)
        max_tokens = param if param is not None else room
        natural = max_tokens if body.get("ignore_eos") else answer.natural_length
        min_tokens: int = body["min_tokens"] if isinstance(body.get("min_tokens"), int) else 0
        limit = max(1, min(max_tokens, max(natural, min_tokens)))
        return param, limit, "length" if limit == max_tokens else "stop"

    async def _outputs(self, seq: Sequence) -> AsyncIterator[tuple[int, Output]]:
        """(tokens generated before this output, output) until the request finishes."""
        done = 0
        while True:
            out = await seq.events.get()
            yield done, out
            done += out.new_tokens
            if out.finish_reason is not None:
                return

    async def _complete(self, request: web.Request, seq: Sequence, answer: Answer, stall: int | None,
                        shape: Callable[[Answer, Sequence, Output], dict[str, Any]]) -> web.Response:
        """A whole answer once the request finishes, in the route's `shape` (Envelope.whole,
        ResponsesEnvelope.whole); a stall, an engine error or an abort answer as vLLM's would."""
        async for before, out in self._outputs(seq):
            if stall is not None and before + out.new_tokens >= stall and out.finish_reason is None:
                return await self._stall(request, seq)
            if out.finish_reason is None:
                continue
            if out.finish_reason == "error":
                return _error(out.error or "KV transfer failed", 500, "InternalServerError")
            if out.finish_reason == "abort":
                return _error("The request was aborted", 503, "ServiceUnavailableError")
            return web.json_response(shape(corrupted(answer) if seq.corrupt else answer, seq, out))
        raise AssertionError("a request ended without a finish reason")

    async def _stream_responses(self, request: web.Request, seq: Sequence, answer: Answer,
                                shaped: ResponsesEnvelope, stall: int | None) -> web.StreamResponse:
        """A Responses stream: the lifecycle events around one message's text deltas."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for event in shaped.opening():
            await response.write(event)
        if stall == 0:
            await self._stall(request, seq)
            return response
        text = ""
        async for before, out in self._outputs(seq):
            if out.finish_reason in ("error", "abort"):
                await response.write(shaped.error(out.error or "The request was aborted", "server_error"))
                break
            if before == 0 and seq.corrupt:
                answer = corrupted(answer)
            after = before + out.new_tokens
            delta = answer.text(before, after)
            if delta:
                if not text:
                    for event in shaped.text_open():
                        await response.write(event)
                text += delta
                await response.write(shaped.delta(delta))
            if stall is not None and after >= stall and out.finish_reason is None:
                await self._stall(request, seq)
                return response
            if out.finish_reason is not None:
                status = "incomplete" if out.finish_reason == "length" else "completed"
                for event in shaped.closing(text, status, seq.prompt_len, seq.generated, out.kv_transfer_params,
                                            seq.local_hit):
                    await response.write(event)
        await response.write_eof()
        return response

    async def _stall(self, request: web.Request, seq: Sequence) -> web.Response:
        """The stall fault: the engine stops working on the request, the client hears nothing more."""
        self.faults.counts[STALL] += 1
        self.engine.abort(seq)
        await self._hold(request)
        return _error("The server is shutting down", 503, "ServiceUnavailableError")

    async def _stream(self, request: web.Request, body: dict[str, Any], seq: Sequence, answer: Answer,
                      envelope: Envelope, stall: int | None = None) -> web.StreamResponse:
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) or self.config.serve.force_include_usage
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def write(chunk: dict[str, Any] | str) -> None:
            await response.write(sse(chunk))

        if stall == 0:
            await self._stall(request, seq)
            return response
        async for before, out in self._outputs(seq):
            if out.finish_reason in ("error", "abort"):
                await write(error_body(out.error or "The request was aborted", "InternalServerError", 500))
                break
            if before == 0 and seq.corrupt:
                answer = corrupted(answer)
            after = before + out.new_tokens
            if envelope.chat and before == 0:
                await write(envelope.role_chunk())
            chunk = self._delta_chunk(envelope, answer, before, after, out)
            if chunk is not None:
                if continuous:
                    chunk["usage"] = envelope.usage_chunk(seq.prompt_len, after)["usage"]
                await write(chunk)
            if stall is not None and after >= stall and out.finish_reason is None:
                await self._stall(request, seq)
                return response
        else:
            if include_usage:
                await write(envelope.usage_chunk(seq.prompt_len, seq.generated))
        await write("[DONE]")
        await response.write_eof()
        return response

    @staticmethod
    def _delta_chunk(envelope: Envelope, answer: Answer, before: int, after: int, out: Output) -> dict[str, Any] | None:
        if not envelope.chat:
            return envelope.completion_chunk(answer, before, after, out.finish_reason, out.kv_transfer_params)
        return envelope.chat_chunk(answer, before, after, out.finish_reason, out.kv_transfer_params)


async def drain(sim: Simulator, timeout: float) -> None:
    """SIGTERM: stop taking requests, let in-flight ones finish (at most `timeout` s), then stop the loop."""
    sim.draining = True
    engine = sim.engine
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while engine.in_flight and loop.time() < deadline:
        await asyncio.sleep(0.05)
    if engine.in_flight:
        log.warning("shutdown timeout: aborting %d requests", engine.in_flight)
        for rank in engine.ranks:
            for seq in [*rank.waiting, *rank.running]:
                engine.abort(seq)
    engine.stopping = True
    engine.wake.set()

