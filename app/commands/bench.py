"""Every `tttr bench NAME`: its arguments and its handler, one section each, in the order
`tttr bench --help` lists them. The work is in `tttr.engine.bench` (its docstring is the index
of what each bench measures and its targets); `bench app` drives the terminal app, so its work
is `tttr.app.bench`. Handlers import the benchmark inside, so that parsing stays light."""

from __future__ import annotations

import argparse
import json
import sys

from tttr.app.commands import args as argtypes
from tttr.app.commands.agent import _model_args
from tttr.kernels.mode import MODES

SYNTHETIC_SHAPES = ("llama-1b", "qwen-0.5b")  # engine/inference/synthetic.py's SHAPES (not imported: numpy, gguf)


def register(sub, bench_sub) -> None:
    for add in (_store, _engine, _determinism, _kernels, _gpu, _sandbox, _replay, _agent, _fidelity, _bisect,
                _suite, _serve, _export, _app):
        add(bench_sub)


def _threads(args) -> None:
    if args.threads:
        import torch  # noqa: PLC0415 - torch loads in the handler so that `tttr --help` stays fast

        torch.set_num_threads(args.threads)


# ------------------------------------------------------------ tttr bench store
def _store(bench_sub) -> None:
    p = bench_sub.add_parser(
        "store",
        help="session store: append rate, window read time, bytes per event",
        description="Append 100k token events in steps of 50, open a 1M-event database and read a "
        "200-event window from its middle, and measure bytes per event on disk.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--events", type=argtypes.bench_events, default=100_000, help="token events to append, at least 1,000 (default 100,000)")
    p.add_argument("--window-events", type=argtypes.bench_events, default=1_000_000, help="events in the window database, at least 1,000 (default 1,000,000)")
    p.set_defaults(func=cmd_store)


def cmd_store(args: argparse.Namespace) -> int:
    from tttr.engine.bench import store as store_bench

    result = store_bench.run(events=args.events, window_events=args.window_events)
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(store_bench.lines(result)))
    return 0


# ------------------------------------------------------------ tttr bench engine
def _engine(bench_sub) -> None:
    b = bench_sub.add_parser(
        "engine", help="engine decode speed: single stream, 8-way batch, cold start, against transformers and llama.cpp",
        description="On the default model (or --model), side by side in one run: single-stream "
                    "decode tokens/s, aggregate tokens/s with 8 concurrent sequences, the cold start "
                    "of `tttr generate` (time and peak memory), and as references transformers' generate "
                    "and llama.cpp (llama-cpp-python) on the same file, prompt ids and threads, each "
                    "when installed, with greedy agreement against llama.cpp.",
    )
    b.add_argument("--model", default=None, help="a .gguf file (default: the embedded default)")
    b.add_argument("--synthetic", choices=SYNTHETIC_SHAPES, default=None,
                   help="instead of --model: random weights (fixed seed) in a real model's shape, written and "
                        "cached on first use (Q4_K_M by llama.cpp's quantizer where installed, else F16); "
                        "measures decode, 8-way, prefill, time to first token, cold start and memory against "
                        "llama.cpp and the machine's bandwidth and FMA peak (speed only: the text means nothing)")
    b.add_argument("--prefill", type=_prompt_lengths, default=(512, 2048),
                   help="with --synthetic: prompt lengths whose prefill is measured, comma-separated (default 512,2048)")
    b.add_argument("--tokens", type=argtypes.positive, default=None,
                   help="tokens per sequence (default 100; 32 with --synthetic)")
    b.add_argument("--kernels", choices=MODES, default="invariant",
                   help="kernel mode (default invariant, as generate, record and serve)")
    b.add_argument("--threads", type=argtypes.threads, default=None,
                   help="threads for every side: torch's intra-op threads, the compiled kernels', the "
                        "cold-start processes' and llama.cpp's (default: torch's default, the core count)")
    b.add_argument("--rounds", type=argtypes.positive, default=None,
                   help="measurement rounds, alternating ours and the reference; the best of each counts "
                        "(default 3; 1 with --synthetic)")
    b.add_argument("--no-cold", action="store_true", help="skip the cold-start processes")
    b.add_argument("--no-reference", action="store_true", help="skip the transformers reference (llama.cpp still runs when installed)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_engine)


def _prompt_lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(x) for x in text.split(","))
    except ValueError:
        lengths = ()
    if not lengths or any(not 1 <= n <= 8000 for n in lengths):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of prompt lengths in 1..8000")
    return lengths


def cmd_engine(args) -> int:
    if args.synthetic is not None and args.model is not None:
        print("tttr: error: --synthetic and --model are exclusive: the synthetic bench writes its own file",
              file=sys.stderr)
        return 2
    if args.synthetic is None:
        from tttr.engine.inference.loader import model_source

        model_path = model_source(args.model)  # a wrong path or a file that is no model: refused before any work
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.synthetic is not None:
        from tttr.engine.bench import engine_synthetic as bench_synthetic

        report = bench_synthetic.run(args.synthetic, tokens=max(2, args.tokens or 32), prefill=args.prefill,
                                     rounds=args.rounds or 1, kernels=args.kernels, cold=not args.no_cold,
                                     progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(json.dumps(report) if args.json else bench_synthetic.format_report(report))
        return 0

    from tttr.engine.bench.engine import format_report, run_bench

    report = run_bench(model_path=model_path, tokens=args.tokens or 100, kernels=args.kernels,
                       reference=not args.no_reference, rounds=args.rounds or 3, cold=not args.no_cold)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_report(report))
    return 0


# ------------------------------------------------------------ tttr bench determinism
def _determinism(bench_sub) -> None:
    d = bench_sub.add_parser(
        "determinism", help="same prompt, random batch neighbours: unique completions and digests per kernel mode",
        description="Generate the same prompt --runs times (greedy, and sampled at T=0.8 with a fixed seed), each "
                    "time co-batched with 0-15 random prompts at a random row, under each kernel mode; print the "
                    "number of unique completions and logits-digest sequences and the first differing position. "
                    "Then compare one prefill, chunked prefill and token-by-token decode. Expected: invariant gives "
                    "exactly 1 and 1 and identical prefill paths; fast differs in the prefill paths, and under "
                    "co-batching too where its products are stock (dense weights; a quantized GGUF's products are "
                    "invariant in both modes). Progress goes to stderr.",
    )
    d.add_argument("--runs", type=argtypes.positive, default=100, help="generations per mode and sampling (default 100)")
    d.add_argument("--tokens", type=argtypes.positive, default=40, help="tokens per generation (default 40)")
    d.add_argument("--seed", type=argtypes.seed, default=1234, help="seed of the batch compositions and the sampler (default 1234)")
    d.add_argument("--threads", type=argtypes.threads, help="torch threads (default: torch's)")
    d.add_argument("--synthetic", choices=SYNTHETIC_SHAPES, default=None,
                   help="on random weights in a real model's shape (as bench engine --synthetic) instead of the "
                        "default model")
    d.add_argument("--kernels", choices=("invariant", "invariant-q8"), default="invariant",
                   help="the invariant mode shown beside fast (default invariant; invariant-q8: 8-bit activations "
                        "in the block products, as llama.cpp)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_determinism)


def cmd_determinism(args) -> int:
    _threads(args)
    from tttr.engine.bench import determinism  # noqa: PLC0415 - loads torch; only when this command runs

    model = None
    if args.synthetic:
        from tttr.engine.inference import synthetic  # noqa: PLC0415
        from tttr.engine.inference.model import load_model  # noqa: PLC0415

        model = load_model(synthetic.ensure(args.synthetic, progress=lambda line: print(line, file=sys.stderr)))
    cfg = determinism.Config(runs=args.runs, tokens=args.tokens, seed=args.seed, kernels=args.kernels)
    result = determinism.run(cfg, model=model)
    print(json.dumps(result, indent=1) if args.json else "\n".join(determinism.lines(result)))
    return 0


# ------------------------------------------------------------ tttr bench kernels
def _kernels(bench_sub) -> None:
    k = bench_sub.add_parser(
        "kernels", help="invariant vs fast kernels: per-op time and end-to-end decode tok/s, side by side",
        description="Per-op time at the default model's decode and prefill shapes and end-to-end decode tokens/s "
                    "(1 and 8 streams), invariant against fast, alternating round by round in one run. Ratios are "
                    "invariant time / fast time.",
    )
    k.add_argument("--rounds", type=argtypes.positive, default=5, help="alternating rounds per figure (default 5)")
    k.add_argument("--tokens", type=argtypes.positive, default=32, help="tokens per end-to-end generation (default 32)")
    k.add_argument("--ops-only", action="store_true", help="skip the end-to-end part (no model needed)")
    k.add_argument("--threads", type=argtypes.threads, help="torch threads (default: torch's)")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(func=cmd_kernels)


def cmd_kernels(args) -> int:
    _threads(args)
    from tttr.engine.bench import kernels as bench  # noqa: PLC0415 - loads torch; only when this command runs

    result = bench.run(rounds=args.rounds, tokens=max(2, args.tokens), e2e=not args.ops_only,
                       progress=bench.progress_stderr)
    print(json.dumps(result, indent=1) if args.json else "\n".join(bench.lines(result)))
    return 0


# ------------------------------------------------------------ tttr bench gpu
def _gpu(bench_sub) -> None:
    g = bench_sub.add_parser(
        "gpu", help="the GPU path: Triton invariant kernels vs cuBLAS, co-batched replays, CPU vs GPU decisions",
        description="On a CUDA machine, one script: the Triton invariant kernels against torch/cuBLAS at the decode "
                    "and prefill shapes of the default model and llama-1b (invariant_over_cublas, target >= 0.8), "
                    "--runs generations of the default model on the GPU co-batched with random prompts (one digest "
                    "sequence expected), and the bench prompts' greedy ids on CPU and GPU. Without CUDA it runs on "
                    "the CPU (Triton interpreter, tiny shapes) to show the script works; its figures are not the GPU's.",
    )
    g.add_argument("--runs", type=argtypes.positive, default=100, help="co-batched generations (default 100)")
    g.add_argument("--tokens", type=argtypes.positive, default=24, help="tokens per generation (default 24)")
    g.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_gpu)


def cmd_gpu(args) -> int:
    import subprocess  # noqa: PLC0415

    from tttr.engine.bench import gpu as bench_gpu  # noqa: PLC0415 - loads torch; only when this command runs

    if args.cpu or not bench_gpu.cuda_available():
        env = bench_gpu.interpreter_env()
        if env is not None:  # the Triton interpreter is chosen when triton is imported: a fresh process
            return subprocess.call([sys.executable, "-m", "tttr.app", "bench", "gpu", "--cpu",
                                    "--runs", str(args.runs), "--tokens", str(args.tokens),
                                    *(["--json"] if args.json else [])], env=env)
    result = bench_gpu.run(cpu=args.cpu, runs=args.runs, tokens=args.tokens,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=1) if args.json else "\n".join(bench_gpu.lines(result)))
    return 0


# ------------------------------------------------------------ tttr bench sandbox
def _sandbox(bench_sub) -> None:
    b = bench_sub.add_parser(
        "sandbox", help="sandbox overhead per command, snapshot and restore of a 1,000-file tree",
        description="Per-command sandbox overhead against plain `bash -c` (target <= 20 ms), snapshot "
                    "of a 1,000-file tree with 10 files changed (<= 50 ms), restore of it (<= 100 ms). "
                    "Medians, measured side by side.",
    )
    b.add_argument("--repeats", type=argtypes.positive, default=15, help="measurements per figure; medians are reported (default 15)")
    b.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="where the sandbox is refused, measure unconfined commands (unsafe)")
    b.add_argument("--json", action="store_true", help="print overhead_ms, snapshot_ms, restore_ms, … as JSON")
    b.set_defaults(func=cmd_sandbox)


def cmd_sandbox(args) -> int:
    from tttr.engine.bench.sandbox import format_lines, run_bench

    res = run_bench(repeats=args.repeats, unsafe_no_sandbox=args.unsafe_no_sandbox)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print("\n".join(format_lines(res)))
    return 0


# ------------------------------------------------------------ tttr bench replay
def _replay(bench_sub) -> None:
    b = bench_sub.add_parser(
        "replay", help="replay fidelity per layer and replay/fork/record speed",
        description="Records runs over the task suite, then measures: faithful replay fidelity, "
                    "tensor-freed fidelity (co-batched), token-freed agreement of actions, and the "
                    "speed of faithful replay and of a late fork against recording, and recording's "
                    "overhead against the same run unrecorded.",
    )
    b.add_argument("--runs", type=argtypes.steps, default=10, help="runs to record (default 10)")
    b.add_argument("--db", help="database to keep the runs in (default: a temporary file)")
    _model_args(b)
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_replay)


def cmd_replay(args) -> int:
    from tttr.engine.inference.loader import resolve_model_path
    from tttr.engine.bench.replay import run_bench

    resolve_model_path(args.model)  # a wrong path is refused before any work
    result = run_bench(runs=args.runs, db=args.db, model=args.model,
                       unsafe_no_sandbox=args.unsafe_no_sandbox, log=None if args.json else print)
    if args.json:
        print(json.dumps(result))
    return 0


# ------------------------------------------------------------ tttr bench agent
def _agent(bench_sub) -> None:
    b = bench_sub.add_parser(
        "agent", help="record, replay and fork a user's agent program: speedups, overhead, SDK import",
        description="Runs assets/examples/openai_agent.py on the write-line task, each round: recorded "
                    "(tttr record), unrecorded in the same sandbox against the server without a database, "
                    "replayed faithfully, and forked at its last model call. Prints whether the replays are "
                    "identical, replay and fork speedups over recording, recording's overhead on the "
                    "program's run, and the SDK's import time in a fresh interpreter.",
    )
    b.add_argument("--rounds", type=argtypes.bounded_int(1, 100, "a round count"), default=3,
                   help="measurement rounds; the best of each side counts (default 3)")
    _model_args(b)
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_agent)


def cmd_agent(args) -> int:
    from tttr.engine.bench.agent import format_report, run_bench
    from tttr.engine.inference.loader import resolve_model_path

    resolve_model_path(args.model)  # a wrong path is refused before any work

    def progress(text: str) -> None:
        print(f"bench agent: {text}", file=sys.stderr, flush=True)

    report = run_bench(rounds=args.rounds, model=args.model, unsafe_no_sandbox=args.unsafe_no_sandbox,
                       progress=progress)
    print(json.dumps(report) if args.json else format_report(report))
    return 0


# ------------------------------------------------------------ tttr bench fidelity
def _fidelity(bench_sub) -> None:
    b = bench_sub.add_parser(
        "fidelity", help="faithful replays under CPU load, the world's reuse, and how often it answers otherwise",
        description="While busy processes keep every core loaded: records the three example programs and five "
                    "built-in tasks and replays each faithfully --replays times (identical_fraction, target 1.0); "
                    "forks each built-in run twice at setup:clock (world_reuse_fraction: of the commands the forks "
                    "needed that their source never ran, those answered from the database); runs every recorded "
                    "command again in its recorded state (same_state_disagreement: how often the world answers "
                    "otherwise). A few minutes on 2 cores.",
    )
    b.add_argument("--replays", type=argtypes.bounded_int(1, 50, "a replay count"), default=5,
                   help="faithful replays of each recording (default 5)")
    b.add_argument("--load", type=argtypes.bounded_int(0, 64, "a process count"),
                   help="busy processes kept running meanwhile (default: one per core; 0: none)")
    b.add_argument("--examples", metavar="NAMES", help="comma-separated example programs (default: all three)")
    b.add_argument("--tasks", metavar="NAMES", help="comma-separated built-in tasks (default: five easy ones)")
    _model_args(b)
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_fidelity)


def cmd_fidelity(args) -> int:
    from tttr.engine.bench.fidelity import EXAMPLES, TASKS, format_report, run_bench
    from tttr.engine.inference.loader import resolve_model_path
    from tttr.recorders.tasks import load_task
    from tttr.sessions.errors import TTTRError

    resolve_model_path(args.model)  # a wrong path is refused before any work
    examples = _names(args.examples, EXAMPLES, "--examples")
    for name in (tasks := _names(args.tasks, TASKS, "--tasks")):
        load_task(name)  # an unknown task is refused before any work
    bad = [e for e in examples if e not in EXAMPLES]
    if bad:
        raise TTTRError(f"--examples: no example program {bad[0]!r}: choose among {', '.join(EXAMPLES)}")

    def progress(text: str) -> None:
        print(f"bench fidelity: {text}", file=sys.stderr, flush=True)

    report = run_bench(replays=args.replays, examples=examples, tasks=tasks, model=args.model, load=args.load,
                       unsafe_no_sandbox=args.unsafe_no_sandbox, progress=progress)
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def _names(text: str | None, default: tuple[str, ...], option: str) -> tuple[str, ...]:
    if text is None:
        return default
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        from tttr.sessions.errors import TTTRError

        raise TTTRError(f"{option} names nothing: give comma-separated names, e.g. {default[0]}")
    return names


# ------------------------------------------------------------ tttr bench bisect
def _bisect(bench_sub) -> None:
    b = bench_sub.add_parser(
        "bisect", help="triage and bisect against planted causes: layer named, site found, replays, batching",
        description="Records passing runs with the default model (write-line; today-report made to pass by "
                    "its last clock), plants one known cause in each by forking it — a clock shift, a changed "
                    "tool result, a flipped token — beside innocent clock shifts, keeps the plants whose fork "
                    "fails, and checks that tttr triage names the planted layer and tttr bisect finds the "
                    "planted site. Prints the fractions, the replays beside 2*log2(n)+2, and bisect's speedup "
                    "with batched tests over --one-at-a-time. Progress on stderr.",
    )
    b.add_argument("--kinds", type=_kinds, default=None, metavar="KIND[,KIND]",
                   help="plants to make: clock, tool, token (default all three)")
    b.add_argument("--db", help="database to keep the runs in (default: a temporary file)")
    _model_args(b)
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_bisect)


def _kinds(text: str) -> tuple[str, ...]:
    import argparse

    from tttr.engine.bench.bisect import KINDS

    kinds = tuple(k.strip() for k in text.split(","))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: give plant kinds from {', '.join(KINDS)}, each once, "
                                         "separated by commas")
    return kinds


def cmd_bisect(args) -> int:
    import json

    from tttr.engine.inference.loader import resolve_model_path
    from tttr.engine.bench.bisect import KINDS, format_report, run_bench

    resolve_model_path(args.model)  # a wrong path is refused before any work

    def progress(text: str) -> None:
        print(f"bench bisect: {text}", file=sys.stderr, flush=True)

    report = run_bench(kinds=args.kinds or KINDS, db=args.db, model=args.model,
                       unsafe_no_sandbox=args.unsafe_no_sandbox, progress=progress)
    print(json.dumps(report) if args.json else format_report(report))
    return 0


# ------------------------------------------------------------ tttr bench suite
def _suite(bench_sub) -> None:
    b = bench_sub.add_parser(
        "suite", help="a small suite in process and over 2 Ray workers; merge rate; pinned identity",
        description="Time a small suite of the built-in agent (write-line, make-dir; --runs per condition) in "
                    "process (2 runs in flight) and as Ray tasks on a local instance of 2 CPUs: runs_per_s of "
                    "each and ray_over_local (target >= 0.9); merge_events_per_s (target >= 100,000); and "
                    "pinned_identical (the pinned runs of both suites agree event for event). Needs tttr[ray].",
    )
    b.add_argument("--runs", type=argtypes.bounded_int(2, 20, "a run count"), default=2,
                   help="runs per task and condition (default 2)")
    b.add_argument("--merge-events", type=argtypes.bench_events, default=200_000,
                   help="events in the merged database (default 200,000)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_suite)


def cmd_suite(args) -> int:
    import json

    from tttr.engine.replay.ray_suite import _ray

    _ray()  # Ray installed, or one line
    from tttr.engine.bench.suite import format_lines, run

    res = run(runs=args.runs, merge_events=args.merge_events)
    print(json.dumps(res, indent=2) if args.json else "\n".join(format_lines(res)))
    return 0


# ------------------------------------------------------------ tttr bench serve
def _serve(bench_sub) -> None:
    b = bench_sub.add_parser(
        "serve", help="the server's speed and determinism under load: HTTP vs the engine, recording overhead",
        description="On the default model (or --model), side by side in one run: aggregate tokens/s through HTTP "
                    "with 1 and 8 concurrent streaming clients (servers in their own processes), the engine's own "
                    "aggregate at 8 sequences without HTTP, server_over_engine_8, identical_under_load_fraction "
                    "(answers under load equal to the same requests alone), ttft_ms_p50 at 8 clients, and "
                    "record_overhead (a server with --db against one without).",
    )
    b.add_argument("--model", default=None, help="a .gguf file (default: the embedded default)")
    b.add_argument("--tokens", type=argtypes.positive, default=48, help="tokens per request at most (default 48)")
    b.add_argument("--rounds", type=argtypes.positive, default=3,
                   help="measurement rounds, the engine and both servers in turn; the best of each counts (default 3)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    import json

    from tttr.engine.inference.loader import resolve_model_path
    from tttr.engine.bench.serve import format_report, run_bench

    model_path = resolve_model_path(args.model)  # a wrong path is refused before any work

    def progress(text: str) -> None:
        print(f"bench serve: {text}", file=sys.stderr, flush=True)

    report = run_bench(model_path=model_path, tokens=args.tokens, rounds=args.rounds, progress=progress)
    print(json.dumps(report) if args.json else format_report(report))
    return 0


# ------------------------------------------------------------ tttr bench export
def _export(bench_sub) -> None:
    p = bench_sub.add_parser(
        "export",
        help="traces: export and import spans per second, and the round trip",
        description="Export and import a 10,000-span trace (a recorded program's calls and tools, imported) "
                    "through a session database, and check that export, import, export gives the same file.",
    )
    p.add_argument("--spans", type=argtypes.bench_events, default=10_000, help="spans in the trace (default 10,000)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from tttr.engine.bench.export import lines, run_bench

    result = run_bench(spans=args.spans)
    print(json.dumps(result) if args.json else "\n".join(lines(result)))
    return 0


# ------------------------------------------------------------ tttr bench app
def _app(bench_sub) -> None:
    b = bench_sub.add_parser(
        "app", help="app open time and key-press latency on a generated 100k-event run",
        description="Generates a database with two runs of --events events through the real store, "
                    "then drives the app headless with Textual's pilot: open_s is start to first "
                    "paint of the first run's timeline, keypress_ms the median key-press latency over "
                    "stepping keys (event, step, layer, page, start, end); compare_open_s is the "
                    "time to open the compare of the two runs (rows painted), compare_keypress_ms "
                    "its keys' median; runs_list_ms is start to first paint of the runs list of a "
                    "generated database of --runs runs.",
    )
    b.add_argument("--events", type=argtypes.bench_events, default=100_000, help="events in the generated run, at least 1,000 (default 100000)")
    b.add_argument("--runs", type=argtypes.count, default=50_000,
                   help="runs in the database whose runs list is opened (runs_list_ms; default 50000; 0: skip)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_app)


def cmd_app(args) -> int:
    from tttr.app.bench import format_lines, measure

    figures = measure(args.events, runs=args.runs)
    if args.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))
    else:
        print("\n".join(format_lines(figures)))
    return 0
