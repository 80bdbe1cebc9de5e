"""Slow-loris clients against a worker: when are their connections closed, and does a long
streamed answer running beside them finish?

    python -m bench.slow_clients --clients 50 --give-up 90

Starts ``python -m engine serve`` on 127.0.0.1 (the built-in model; ``--root`` runs another
checkout's engine), opens ``--clients`` connections that each send the start of a request
and then one more header line every ``--every`` seconds, never finishing it, and waits at
most ``--give-up`` seconds for the worker to close each. Meanwhile one client streams a
``--stream-tokens`` answer from ``/completion``. Prints one JSON line: how many connections
were closed, when (min / median / max seconds after they opened), with which status, and
the stream's length and duration. Loopback only; every connection is closed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench._serve import REPO, worker

START = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
         b"Content-Type: application/json\r\n")


async def slow_client(host: str, port: int, every: float, give_up: float) -> dict[str, Any]:
    """One slow-loris connection: the seconds until the worker closed it (None: it was
    still open at ``give_up``) and the status line it answered, if any."""
    reader, writer = await asyncio.open_connection(host, port)
    start = time.perf_counter()
    writer.write(START)

    async def trickle() -> None:
        n = 0
        while True:
            await asyncio.sleep(every)
            n += 1
            writer.write(f"X-Slow-{n}: 1\r\n".encode())
            await writer.drain()

    feeding = asyncio.create_task(trickle())
    answer = b""
    closed_s: float | None = None
    try:
        answer = await asyncio.wait_for(reader.read(), give_up)  # until the worker closes
        closed_s = time.perf_counter() - start
    except (TimeoutError, ConnectionError):
        pass
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await feeding
        writer.close()
    status = answer.split(b"\r\n", 1)[0].decode("latin-1") if answer else None
    return {"closed_s": closed_s, "status": status}


async def stream(url: str, tokens: int, give_up: float) -> dict[str, Any]:
    """A streamed /completion of ``tokens`` tokens: whether it came whole, and how long."""
    start = time.perf_counter()
    last: dict[str, Any] = {}
    body = {"prompt": "Once upon a time", "stream": True, "n_predict": tokens,
            "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=give_up + tokens) as http, \
            http.stream("POST", "/completion", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
    predicted = last.get("timings", {}).get("predicted_n")
    return {"tokens": predicted, "whole": bool(last.get("stop")) and predicted == tokens,
            "seconds": round(time.perf_counter() - start, 1)}


async def measure(url: str, host: str, port: int, args: argparse.Namespace) -> dict[str, Any]:
    jobs = [slow_client(host, port, args.every, args.give_up) for _ in range(args.clients)]
    streaming = stream(url, args.stream_tokens, args.give_up) if args.stream_tokens else None
    results = await asyncio.gather(*jobs, *([streaming] if streaming else []))
    clients = results[:args.clients]
    closed = sorted(c["closed_s"] for c in clients if c["closed_s"] is not None)
    statuses: dict[str, int] = {}
    for c in clients:
        key = c["status"] or ("closed, no answer" if c["closed_s"] is not None else "open")
        statuses[key] = statuses.get(key, 0) + 1
    return {
        "clients": args.clients, "give_up_s": args.give_up, "every_s": args.every,
        "closed": len(closed),
        "closed_s": {"min": round(closed[0], 1), "median": round(statistics.median(closed), 1),
                     "max": round(closed[-1], 1)} if closed else None,
        "answers": statuses,
        "stream": results[-1] if streaming else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--give-up", type=float, default=90.0, metavar="SECONDS",
                        help="how long to wait for the worker to close each connection")
    parser.add_argument("--every", type=float, default=5.0, metavar="SECONDS",
                        help="a slow client sends one more header line this often")
    parser.add_argument("--stream-tokens", type=int, default=1200, metavar="N",
                        help="a streamed answer of N tokens runs beside them (0: none)")
    parser.add_argument("--read-timeout", type=float, metavar="SECONDS",
                        help="pass --read-timeout to the worker (default: its own default)")
    parser.add_argument("--root", type=Path, default=REPO,
                        help="checkout whose engine the worker runs (default: this one)")
    args = parser.parse_args(argv)
    extra = [] if args.read_timeout is None else ["--read-timeout", str(args.read_timeout)]
    with worker(*extra, root=args.root) as w:
        result = asyncio.run(measure(w.url, w.host, w.port, args))
    print(json.dumps({"bench": "slow_clients", "root": str(args.root), **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
