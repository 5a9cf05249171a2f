"""Counters, gauges and histograms in the Prometheus text exposition format (version 0.0.4).

Written by the event loop (requests) and the worker threads (batches, decoding steps), read by
/metrics: one lock guards them. The families are declared once in FAMILIES, so a scrape lists
every metric even before its first sample.
"""
from __future__ import annotations

import math
import threading

SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKENS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)

# name -> (type, help, histogram buckets)
FAMILIES = {
    "lmforge_requests_total": ("counter", "HTTP requests answered, by route and status", None),
    "lmforge_request_seconds": ("histogram", "HTTP request latency, by route", SECONDS),
    "lmforge_rejected_total": ("counter", "requests refused before queueing, by limit", None),
    "lmforge_queue_requests": ("gauge", "requests admitted and not yet answered", None),
    "lmforge_queue_tokens": ("gauge", "tokens of the requests admitted and not yet answered", None),
    "lmforge_queue_jobs": ("gauge", "jobs waiting for a worker", None),
    "lmforge_pending_body_bytes": ("gauge", "bytes of request bodies held, from their first byte to their "
                                   "answer (max_pending_bytes)", None),
    "lmforge_batch_size": ("histogram", "texts per forward pass of a worker, by job kind", COUNTS),
    "lmforge_batch_tokens": ("histogram", "tokens per forward pass of a worker, by job kind", TOKENS),
    "lmforge_tokens_total": ("counter", "tokens processed, by job kind (input, or generated)", None),
    "lmforge_phase_seconds": ("histogram", ("time per phase: tokenize (counting, event loop), queue "
                                            "(waiting), compute (worker), first_token, decode_step"),
                              SECONDS),
    "lmforge_decode_steps_total": ("counter", "forward passes of generation (prompt, each new token)", None),
    "lmforge_generations_total": ("counter", "generations ended, by reason (stop, length, cancelled, error)",
                                  None),
    "lmforge_generation_steps": ("histogram", "forward passes per generation, by finish reason", COUNTS),
    "lmforge_steps_after_cancel_total": ("counter", "decoding steps begun after a cancel", None),
    "lmforge_worker_busy_seconds_total": ("counter", "time the worker threads spent running jobs (summed)",
                                          None),
    "lmforge_tokens_per_second": ("gauge", "the workers' recent throughput (exponential average)", None),
}


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    escaped = (str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"") for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, escaped)) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Metrics:
    """Thread-safe metric store: inc / set / observe by family name and labels, render() for /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict = {name: {} for name in FAMILIES}  # name -> {label tuple: value or histogram}

    def _key(self, name: str, labels: dict) -> tuple:
        if name not in FAMILIES:
            raise KeyError(f"unknown metric {name!r}")
        return tuple(sorted(labels.items()))

    def inc(self, name: str, value: float = 1.0, **labels) -> None:
        """Add `value` to a counter (or gauge)."""
        key = self._key(name, labels)
        with self._lock:
            self._values[name][key] = self._values[name].get(key, 0.0) + value

    def set(self, name: str, value: float, **labels) -> None:
        """Set a gauge."""
        key = self._key(name, labels)
        with self._lock:
            self._values[name][key] = float(value)

    def observe(self, name: str, value: float, **labels) -> None:
        """Add one observation to a histogram."""
        key, buckets = self._key(name, labels), FAMILIES[name][2]
        with self._lock:
            counts, total, n = self._values[name].get(key) or ([0] * len(buckets), 0.0, 0)
            counts = [c + (value <= b) for c, b in zip(counts, buckets)]
            self._values[name][key] = (counts, total + value, n + 1)

    def value(self, name: str, **labels) -> float:
        """A counter or gauge's current value (0 when never set); a histogram's count."""
        with self._lock:
            found = self._values[name].get(self._key(name, labels), 0.0)
        return float(found[2] if isinstance(found, tuple) else found)

    def total(self, name: str) -> float:
        """A counter's sum over all its labels."""
        with self._lock:
            return float(sum(v[2] if isinstance(v, tuple) else v for v in self._values[name].values()))

    def render(self) -> str:
        """Every family in the Prometheus text format."""
        lines = []
        with self._lock:
            snapshot = {name: dict(values) for name, values in self._values.items()}
        for name, (kind, help_text, buckets) in FAMILIES.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for key, value in sorted(snapshot[name].items()):
                labels = dict(key)
                if kind != "histogram":
                    lines.append(f"{name}{_labels(labels)} {_number(value)}")
                    continue
                counts, total, n = value
                for bound, count in zip(buckets, counts):
                    lines.append(f"{name}_bucket{_labels({**labels, 'le': _number(bound)})} {count}")
                lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {n}")
                lines += [f"{name}_sum{_labels(labels)} {_number(total)}",
                          f"{name}_count{_labels(labels)} {n}"]
        return "\n".join(lines) + "\n"
