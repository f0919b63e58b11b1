"""``train run|estimate|recommend``: the training companion."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def cmd_train(args: argparse.Namespace) -> int:
    import json

    if args.train_command == "estimate":
        from deploy_opt.train.memory import estimate_memory, format_estimate, parse_count

        estimate = estimate_memory(
            parse_count(args.params),
            args.optimizer,
            args.state,
            args.param_dtype,
            shards=args.shards,
            block_size=args.block_size,
            shard=args.shard,
        )
        print(json.dumps(estimate.to_json(), indent=1) if args.json else format_estimate(estimate))
        return 0
    if args.train_command == "recommend":
        from deploy_opt.train.memory import parse_count
        from deploy_opt.train.recommend import format_recommendation, recommend

        if not args.verbose:  # the printed lines carry the reasons; the log copy is for training runs
            logging.getLogger("deploy_opt.train.recommend").setLevel(logging.WARNING)
        rec = recommend(
            args.model_type, parse_count(args.params), parse_count(args.samples), args.memory_gb, seq_len=args.seq_len
        )
        print(json.dumps(rec.to_json(), indent=1) if args.json else format_recommendation(rec))
        return 0
    if args.train_command == "search":
        return _search(args)
    from deploy_opt.config.profiles import config_path
    from deploy_opt.train.config import load_train_config
    from deploy_opt.train.loop import train

    given = args.config or args.config_flag
    config = load_train_config(config_path(given, "train_digits"), args.overrides)
    # The shipped example lives inside the package: its output goes under the working folder instead.
    output_dir = args.output_dir or (Path("reports") / "train-digits" if given is None else None)
    result = train(config, output_dir, resume=args.resume, progress=not args.quiet)
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in result.metrics.items())
    loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
    print(
        f"trained {result.steps}/{result.total_steps} steps ({result.skipped_steps} skipped) in {result.seconds:.1f} s:"
        f" final loss {loss}; {metrics}; optimizer state {result.optimizer_state_bytes:,} bytes"
    )
    print(f"  log: {result.log}; checkpoint: {result.checkpoint}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from deploy_opt.config.profiles import config_path
    from deploy_opt.train.search.pipeline import SearchRequest, run_search
    from deploy_opt.train.search.space import load_space

    given = args.config or args.config_flag
    path = Path(config_path(given, "train_digits"))
    request = SearchRequest(
        path,
        tuple(args.overrides),
        load_space(args.space),
        args.trials,
        args.parallel,
        args.address,
        args.gpus_per_trial,
        args.output_dir,
        args.name or path.stem,
    )
    result = run_search(request)
    best, default = result.best, result.default
    if best is None:
        print(f"search: no full-length trial completed; see {result.paths['html']}")
        return 1
    default_loss = "n/a" if default is None or default["eval_loss"] is None else f"{default['eval_loss']:.4g}"
    print(
        f"search: {result.trials} trials ({result.reused} reused from an earlier run) in {result.seconds:.0f} s;"
        f" best trial {best['number']} ({best['label']}) eval_loss {best['eval_loss']:.4g}, default "
        f"{default_loss}"
    )
    print(f"  report: {result.paths['html']}; best config: {result.paths.get('best')}")
    return 0
