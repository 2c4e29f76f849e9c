"""The CPU peak stored per host (training/cpu_peak_cache.py): measured once with the load seen
then, reused, re-measured on request, never stored for training.cpu_peak=run; a broken file is
measured over; the file is replaced whole."""
from __future__ import annotations

import json
import os

import pytest

from conf.choices import CpuPeakMode
from training import cpu_peak_cache
from training.cpu_peak_cache import CACHE_ENV, cache_dir, host_file, host_peak

GF = 1e9


class Measure:
    def __init__(self, *values: float) -> None:
        self.values = list(values)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.values.pop(0), "measured fp32 matmul [fake]", ()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "peaks"))
    return tmp_path / "peaks"


def test_the_cache_folder_follows_the_env_then_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" and host_file("h1") == tmp_path / "x" / "h1.json"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "meshrun" / "cpu_peak"


def test_measured_once_then_reused_with_the_load_seen_then(cache):
    measure = Measure(120 * GF, 60 * GF)
    first = host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=measure)
    again = host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=measure)
    assert measure.calls == 1 and first == again and first.flops == 120 * GF
    entry = json.loads(host_file().read_text())["entries"]["fp32/1t"]
    assert entry["cpu_count"] == os.cpu_count() and len(entry["loadavg"]) == 3
    assert entry["torch_threads"] == 1 and entry["measured_at"].endswith("UTC")
    assert "at load" in first.source and str(host_file()) in first.source


def test_other_threads_or_dtype_are_their_own_entry(cache):
    measure = Measure(120 * GF, 200 * GF, 900 * GF)
    host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=measure)
    assert host_peak("fp32", threads=2, mode=CpuPeakMode.host, measure=measure).flops == 200 * GF
    assert host_peak("bf16", threads=1, mode=CpuPeakMode.host, measure=measure).flops == 900 * GF
    assert sorted(json.loads(host_file().read_text())["entries"]) == ["bf16/1t", "fp32/1t",
                                                                    "fp32/2t"]


def test_remeasure_replaces_and_run_stores_nothing(cache):
    measure = Measure(120 * GF, 150 * GF, 10 * GF)
    host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=measure)
    assert host_peak("fp32", threads=1, mode=CpuPeakMode.remeasure,
                     measure=measure).flops == 150 * GF
    once = host_peak("fp32", threads=1, mode=CpuPeakMode.run, measure=measure)
    assert once.flops == 10 * GF and "this run only" in once.source
    assert host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=measure).flops == 150 * GF
    assert measure.calls == 3


@pytest.mark.parametrize("text", ["{not json", '{"entries": []}',
                                  '{"entries": {"fp32/1t": {"flops": -1}}}',
                                  '{"entries": {"fp32/1t": {"flops": "many"}}}'])
def test_a_broken_file_is_measured_over(cache, text, caplog):
    host_file().parent.mkdir(parents=True)
    host_file().write_text(text)
    peak = host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=Measure(99 * GF))
    assert peak.flops == 99 * GF
    assert json.loads(host_file().read_text())["entries"]["fp32/1t"]["flops"] == 99 * GF


def test_a_write_leaves_the_old_file_whole_when_it_fails(cache, monkeypatch):
    host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=Measure(120 * GF))
    before = host_file().read_text()

    def failing(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cpu_peak_cache.os, "replace", failing)
    peak = host_peak("fp32", threads=1, mode=CpuPeakMode.remeasure, measure=Measure(5 * GF))
    assert peak.flops == 5 * GF and host_file().read_text() == before
    assert [p.name for p in host_file().parent.iterdir()] == [host_file().name]


def test_a_stored_busy_warning_is_repeated_with_the_fix(cache, caplog):
    def busy():
        return 1 * GF, "measured [fake]", ("CPU peak: the machine looks busy",)

    host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=busy)
    caplog.clear()
    host_peak("fp32", threads=1, mode=CpuPeakMode.host, measure=busy)
    assert any("looks busy" in m and "cpu_peak=remeasure" in m for m in caplog.messages)
