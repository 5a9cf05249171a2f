"""`lmforge serve`: the HTTP inference server over one or more model directories.

    lmforge serve --model all-MiniLM-L6-v2 --model gen=runs/gpt/final --port 8000

Routes, limits and the batching worker: lmforge/serve/. --port 0 takes a free port; the address
is printed when the socket is bound. SIGTERM (or Ctrl-C) stops accepting connections, answers
every request already admitted, then exits. With jemalloc or tcmalloc installed (--malloc auto, the
default), the command starts itself again with it preloaded once its arguments are checked
(serve/allocator.py).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys


def limits_of(args):
    """The Limits given on the command line; a bad value is a usage error naming its option."""
    from lmforge.cli.common import flag_values, from_flags
    from lmforge.serve import Limits

    return from_flags(lambda given: Limits(**given), flag_values(args, Limits))


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket (port 0: a free one); a usage error naming --host / --port."""
    from lmforge.cli.common import UsageError

    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: must be between 0 and 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise UsageError(f"--host {host}: cannot resolve ({err.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise UsageError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


MAX_GRACE = 3600.0  # seconds a stopping server may wait for its admitted requests


def checked(args) -> tuple:
    """(limits, model specs, the bound socket, the environment to restart with or None) once every
    argument is checked: a one-line UsageError naming the first bad one, before anything is loaded or
    the process restarted."""
    from lmforge.cli.common import UsageError, existing_model, flag_error
    from lmforge.config.options import OptionsError
    from lmforge.serve import allocator, parse_model_specs
    from lmforge.serve.app import check_threads

    limits = limits_of(args)
    try:
        check_threads(args.threads, args.workers)
    except OptionsError as err:
        raise flag_error(err, {"threads": args.threads, "workers": args.workers}) from None
    if args.graceful_timeout is not None and not 0 < args.graceful_timeout <= MAX_GRACE:  # NaN fails too
        raise UsageError(f"--graceful-timeout {args.graceful_timeout}: seconds in (0, {MAX_GRACE:g}]")
    try:
        specs = parse_model_specs(args.model)
        # one not installed: refused
        environment = allocator.restart_environment(args.malloc, dict(os.environ))
    except ValueError as err:
        raise UsageError(str(err)) from None
    sock = listen(args.host, args.port)  # before loading: a taken port costs nothing
    for _, where in specs:  # a missing directory is refused before a restart, as after one
        try:
            existing_model("--model", where)
        except UsageError:
            sock.close()
            raise
    return limits, specs, sock, environment


def started_as(args) -> bool:
    """Whether this process's own command line is `lmforge serve` with `args`: only then does a restart
    (which runs sys.orig_argv again) serve the same thing, not re-run a program calling main() in-process."""
    if sys.argv[1:2] != ["serve"]:
        return False
    from lmforge.cli.common import with_bounds

    parser = argparse.ArgumentParser(prog="lmforge", add_help=False)  # the serve sub-command alone, as
    add_parsers(parser.add_subparsers(dest="command"))  # lmforge.cli builds it (which imports this module)
    with_bounds(parser)
    try:
        return vars(parser.parse_args(sys.argv[1:])) == vars(args)
    except SystemExit:
        return False


def cmd_serve(args) -> None:
    """Load the models, bind the socket and serve until SIGTERM / Ctrl-C."""
    from lmforge.cli.common import UsageError
    from lmforge.serve import allocator

    limits, specs, sock, environment = checked(args)
    if environment is not None and started_as(args):
        sock.close()  # every argument checked, the port free: the restarted process binds it again
        allocator.restart(environment)
        sock = listen(args.host, args.port)  # still here: no restart was possible, go on as it is
    import torch
    import uvicorn

    from lmforge.serve import create_app, load_served
    from lmforge.serve.limits import HEAD_BYTES
    from lmforge.serve.worker import bound_memory

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)  # each worker runs one op at a time: no inter-op pool needed
    # before loading: no large freed block of the loading stays in glibc's heap for reuse, and before
    # the first forward pass, when oneDNN reads its cache bound; a --malloc allocator not loaded: refused
    malloc = bound_memory(args.malloc)
    models = {}
    for name, where in specs:
        try:
            models[name] = load_served(name, where)
        except (ValueError, OSError) as err:
            raise UsageError(f"--model {where}: {err}") from None
    app = create_app(models, limits, threads, args.workers)
    server, (host, port) = app.state.server, sock.getsockname()[:2]
    print(f"lmforge serve: http://{host}:{port} ({', '.join(models)}; {server.n_workers} worker(s), "
          f"threads {'+'.join(map(str, server.worker_threads))}; malloc {malloc}; page /, docs /docs)",
          flush=True)
    # h11 (not httptools, if installed) with room for a head over the app's bounds: app.Guard refuses it
    # in JSON, where h11's own limit would answer a plain-text 400 (limits.HEAD_BYTES)
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=args.graceful_timeout,
                            access_log=args.access_log, http="h11", h11_max_incomplete_event_size=HEAD_BYTES)
    # after a drain, uvicorn raises the signal that stopped it again: the exit status says SIGTERM
    uvicorn.Server(config).run(sockets=[sock])


def add_parsers(sub) -> None:
    """Add `serve` to the `lmforge` parser."""
    from lmforge.cli.common import integer, option_flags, said
    from lmforge.serve import Limits

    p = sub.add_parser("serve", help="HTTP inference server (embeddings, predictions, fill-mask, generation, "
                       "features, rerank, attention, tokenize)")
    p.add_argument("--model", action="append", required=True, metavar="[NAME=]DIR",
                   help="a model directory or installed model, optionally named (repeat for several)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)")
    said(p.add_argument("--port", type=integer, default=8000,
                        help="the TCP port to listen on (0: a free one, printed)"), bounds="[0, 65535]")
    said(p.add_argument("--threads", type=integer, help="torch threads of the workers, all together"),
         "the CPUs this process may use", "[1, the CPUs this process may use]")
    said(p.add_argument("--workers", type=integer,
                        help="model worker threads, each with threads/workers torch threads"),
         "one per thread when no served model generates, so batches run side by "
         "side; else one", "[1, --threads]")
    said(p.add_argument("--graceful-timeout", type=float, default=60.0,
                        help="seconds SIGTERM waits for admitted requests before cancelling them"),
         bounds=f"(0, {MAX_GRACE:g}]")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"),
                   help="the least severe of the server's log lines printed")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument("--malloc", default="auto", choices=("auto", "jemalloc", "tcmalloc", "glibc"),
                   help="the C allocator: jemalloc (Debian libjemalloc2; resident memory flat under "
                        "batches of changing shapes), tcmalloc (libtcmalloc-minimal4) or glibc's with its "
                        "heap bounded; auto: the first of jemalloc, tcmalloc installed. "
                        "The server starts itself again (same pid) with LD_PRELOAD to use it")
    option_flags(p, Limits)
    p.set_defaults(func=cmd_serve)
