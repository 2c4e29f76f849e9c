"""Composing a sweep's points: `compose_many` (the cached composer) against Hydra's public API
(`hydra.compose` per point inside one `initialize_config_dir`) and `compose_config` per point.

    .venv/bin/python benchmarks/compose_many_time.py [N_SINGLE]

Three 200-point sweeps: only key=value axes (every point on the fast path), axes that change
config groups (one Hydra compose per group combination), and an axis into a dict
(`+cluster.env.*`: merged by Hydra's private override hook). Every path must give equal configs.
This file may use Hydra directly: it measures Hydra; meshrun's own packages may not.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from conf.compose import check_overrides, compose_config, compose_many  # noqa: E402
from conf.search_path import CONF_DIR  # noqa: E402
from conf.schema import RunConfig  # noqa: E402
from sweeps.expand import expand  # noqa: E402
from sweeps.spec_file import inline_sweep  # noqa: E402

SWEEPS = {
    "values": ["model=tiny", "optim.lr=range(1,11)", "schedule.warmup_steps=range(0,20)"],
    "groups": ["model=tiny,debug", "precision=fp32,bf16", "optim.lr=range(1,6)",
               "schedule.warmup_steps=range(0,10)"],
    "merged": ["model=tiny", "+cluster.env.NCCL_DEBUG=INFO,WARN", "optim.lr=range(1,11)",
               "schedule.warmup_steps=range(0,10)"],
}


def public_compose(points) -> list[RunConfig]:
    """Hydra's public API: one initialize_config_dir, one hydra.compose per point."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    out = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for point in points:
            check_overrides(list(point.run_overrides))  # as compose_config does
            out.append(OmegaConf.to_object(compose(config_name="config",
                                                   overrides=list(point.run_overrides))))
    return out


def main() -> None:
    n_single = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    compose_config([])  # import Hydra and warm its caches outside the timings
    for kind, words in SWEEPS.items():
        points = expand(inline_sweep(words))
        start = time.perf_counter()
        stats: dict[str, int] = {}
        many = compose_many([p.overrides for p in points],
                            settings=[p.settings for p in points], stats=stats)
        t_many = time.perf_counter() - start
        start = time.perf_counter()
        public = public_compose(points)
        t_public = time.perf_counter() - start
        start = time.perf_counter()
        single = [compose_config(list(p.run_overrides)) for p in points[:n_single]]
        t_single = (time.perf_counter() - start) / n_single * len(points)
        assert many == public and many[:n_single] == single, kind
        print(f"{kind}: {len(points)} points  compose_many {t_many:.2f} s  "
              f"public hydra.compose in one initialize_config_dir {t_public:.2f} s "
              f"({t_public / t_many:.0f}x)  compose_config per point {t_single:.2f} s "
              f"(from {n_single})  {stats}")


if __name__ == "__main__":
    main()
