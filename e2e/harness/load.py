"""A bounded load generator: `concurrency` clients send requests through the router (loopback only)
until told to stop, `max_requests` are sent, or `max_seconds` pass, whichever comes first; every
request is bounded by its own timeout. Each client sends its next request when the last one ends
(a closed loop), so the load is the number of requests in flight, the signal decode scales on.
Every outcome is kept: a moment with no ready router to send to is a failed request too ("no
endpoint", one per client every 0.2 s while it lasts), never skipped."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .traffic import Answer, failure_kinds, post, prompt


@dataclass
class Load:
    url: Callable[[], str | None]
    """Where to send the next request (a ready router pod); None: none serves (a failure)."""
    concurrency: int
    max_requests: int
    max_seconds: float
    input_words: int = 512
    output_tokens: int = 256
    answers: list[tuple[float, Answer]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        self.started = time.monotonic()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True, name=f"load-{i}")
                         for i in range(self.concurrency)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.max_seconds)

    def _more(self) -> bool:
        with self._lock:
            sent = len(self.answers)
        return (not self._stop.is_set() and sent < self.max_requests
                and time.monotonic() - self.started < self.max_seconds)

    def _client(self, index: int) -> None:
        n = 0
        while self._more():
            url = self.url()
            if url is None:
                with self._lock:
                    self.answers.append((time.monotonic() - self.started,
                                         Answer(0, "", error="no endpoint: no ready router pod")))
                time.sleep(0.2)
                continue
            body: dict[str, Any] = {"model": "kimi-k3", "prompt": prompt(self.input_words, f"l{index}-{n}-"),
                                    "max_tokens": self.output_tokens, "ignore_eos": True}
            answer = post(url, "/v1/completions", body, timeout=120)
            with self._lock:
                self.answers.append((time.monotonic() - self.started, answer))
            n += 1
            if answer.status != 200:
                time.sleep(0.2)  # a refusal (no engine yet) must not spin

    def failed(self) -> list[tuple[float, Answer]]:
        """Every request not answered whole: HTTP errors, broken streams, refused connections and
        moments with no router."""
        return [(t, a) for t, a in self.answers if not (a.status == 200 and a.done)]

    def summary(self) -> str:
        failed = self.failed()
        return (f"{len(self.answers)} requests from {self.concurrency} clients in "
                f"{time.monotonic() - self.started:.0f} s, {len(self.answers) - len(failed)} served, "
                f"{len(failed)} failed {failure_kinds([a for _, a in failed])}")
