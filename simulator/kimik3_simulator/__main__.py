"""``python -m kimik3_simulator vllm serve MODEL [flags...]``: a Kimi K3 vLLM engine stand-in.

Give it the command a serving pod would run (plain or wrapped in `sh -c`); append
`--host 127.0.0.1 --port N` to move it onto loopback. K3SIM_* variables (settings.py) say what the
command line does not: the GPU, the DSpark acceptance, the time scale. A `--headless` worker
command serves nothing and just waits for SIGTERM, like a vLLM worker pod without an API server.
Exit codes: 0 after SIGTERM/SIGINT and the drain, 1 the engine loop failed or the NIXL side channel
could not be bound, 2 bad command line or settings; the faults of K3SIM_FAULTS (faults.py) add the
exit_at_start code they name and 137 for an `oom` nothing killed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from .cmdline import CommandLineError, parse_serve
from .config import EngineConfig, describe, engine_config, engine_metrics
from .engine import Engine
from .faults import EXIT_AT_START, Fault, Faults, parse_faults
from .kv_events import KVEventPublisher
from .nixl import Nixl
from .server import Simulator, drain
from .settings import SettingsError, settings_from_env
from .stats import SimStats

log = logging.getLogger("kimik3_simulator")


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(config: EngineConfig) -> int:
    serve_args = config.serve
    metrics = engine_metrics(config)
    stats = SimStats(config.settings.stats_history)
    nixl = Nixl(config, metrics)
    faults = Faults(parse_faults(config.settings.faults), config.settings.oom_cap_bytes)
    events = serve_args.kv_events
    publisher = (KVEventPublisher(events, config.ranks, serve_args.host or "", os.environ.get("VLLM_HOST_IP", ""))
                 if events and events.publishes else None)
    engine = Engine(config, metrics, stats, nixl, publisher)
    sim = Simulator(config, engine, stats, faults)
    loop = asyncio.get_running_loop()
    sim.ready_at = loop.time() + config.startup_wall_seconds
    try:
        await nixl.start()  # vLLM binds its side channel while the engine starts, before the API server
    except OSError as exc:
        log.error("cannot listen on the NIXL side channel %s: %s",
                  ", ".join(f"{h}:{p}" for h, p in nixl.side_channel.addresses), exc)
        await nixl.stop()
        return 1
    runner = web.AppRunner(sim.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, serve_args.host, serve_args.port, shutdown_timeout=2.0).start()
    faults.start()
    if publisher is not None:
        publisher.start()
    log.info("%s; listening on %s:%d%s", describe(config), serve_args.host, serve_args.port,
             f", NIXL side channel on {', '.join(nixl.as_dict()['listening'])}" if nixl.enabled else "")
    engine_task = asyncio.create_task(engine.run(), name="engine-loop")
    signalled = asyncio.create_task(_until_signalled())
    try:
        await asyncio.wait({engine_task, signalled}, return_when=asyncio.FIRST_COMPLETED)
        if engine_task.done():
            log.error("the engine loop stopped", exc_info=engine_task.exception())
            return 1
        log.info("draining %d requests (shutdown timeout %ds)", engine.in_flight, serve_args.shutdown_timeout)
        await drain(sim, serve_args.shutdown_timeout)
        await asyncio.wait_for(engine_task, timeout=10)
        return 0
    finally:
        signalled.cancel()
        faults.released.set()
        await runner.cleanup()
        await nixl.stop()
        if publisher is not None:
            await publisher.close()
        sim.tracing.shutdown()  # the spans still batched go out before the process ends


async def _crash(fault: Fault) -> int:
    await asyncio.sleep(fault.delay_seconds)
    print(f"k3sim: fault exit_at_start: exiting with {fault.exit_code} before listening", file=sys.stderr)
    return fault.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = settings_from_env()
        logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        serve_args = parse_serve(argv)
        crash = next((f for f in parse_faults(settings.faults) if f.kind == EXIT_AT_START), None)
        if crash is not None:
            return asyncio.run(_crash(crash))
        if serve_args.headless:
            log.info("headless worker of %s: nothing to serve, waiting for SIGTERM", serve_args.model)
            asyncio.run(_until_signalled())
            return 0
        config = engine_config(serve_args, settings)
    except (CommandLineError, SettingsError) as exc:
        print(f"k3sim: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(serve(config))


if __name__ == "__main__":
    raise SystemExit(main())
