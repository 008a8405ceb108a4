"""Artifacts from a file: checked in depth on load (one error naming the field; bad files refused
before they are read), and ``--artifact FILE`` on replay, recorded in config.json."""

from __future__ import annotations

import json
import os
import time

import pytest
from tlora_sim.sim.cli.main import main
from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact
from tlora_sim.traces.errors import InputError


def _raw():
    return json.loads(artifact_path("H200").read_text())


def _write(tmp_path, art, name="a.json"):
    p = tmp_path / name
    p.write_text(json.dumps(art))
    return p


@pytest.mark.parametrize("edit, field", [
    (lambda a: a["models"]["llama3-8b"].__setitem__("l0", {}), "models.llama3-8b.l0.tokens"),
    (lambda a: a["models"]["llama3-8b"]["plans"]["fused"]["coef"].__setitem__("tokens", float("nan")),
     "models.llama3-8b.plans.fused.coef.tokens"),
    (lambda a: a["optimizer"]["coef"].__setitem__("const", float("inf")), "optimizer.coef.const"),
    (lambda a: a["models"]["qwen3-8b"]["head"]["ms"].pop(), "models.qwen3-8b.head.ms"),
    (lambda a: a["models"]["qwen3-8b"]["attn"].__setitem__("512", {"seqs": [2, 1], "ms": [1.0, 2.0]}),
     "models.qwen3-8b.attn.512.seqs"),
    (lambda a: a["models"]["qwen3-8b"]["plans"]["loop"].__setitem__("cpu0", -1.0), "models.qwen3-8b.plans.loop.cpu0"),
])
def test_malformed_artifact_names_the_field(tmp_path, edit, field):
    a = _raw()
    edit(a)
    with pytest.raises(InputError) as e:
        load_artifact(_write(tmp_path, a))
    assert e.value.field == field


def test_bad_files_are_refused_fast(tmp_path, capsys):
    assert main(["costmodel", "show", "--artifact", "/dev/zero"]) == 2
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB of NULs
    t0 = time.perf_counter()
    assert main(["costmodel", "show", "--artifact", str(big)]) == 2
    assert time.perf_counter() - t0 < 5
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    assert main(["costmodel", "show", "--artifact", str(tmp_path / "bin.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("tlora-sim: error:") for line in err)


def test_costmodel_validate_refuses_nan_coefficients(tmp_path, capsys):
    a = _raw()
    a["models"]["llama3-8b"]["plans"]["fused"]["cpu0"] = float("nan")
    p = _write(tmp_path, a)
    assert main(["costmodel", "validate", "--gpu", "H200", "--against-artifact", "--artifact", str(p)]) == 2
    assert "models.llama3-8b.plans.fused.cpu0" in capsys.readouterr().err


def test_replay_with_an_artifact_file_records_its_identity(tmp_path):
    a = _raw()
    a["id"] = "h200-test-artifact"
    for pe in a["models"]["llama3-8b"]["plans"].values():
        pe["cpu0"] = 2 * pe["cpu0"]
    p = _write(tmp_path, a)
    base = ["-q", "replay", "--trace", "synthetic:jobs=20", "--policy", "independent", "--cluster", "1x8xH200",
            "--no-plots"]
    assert main(base + ["--artifact", str(p), "--out", str(tmp_path / "r")]) == 0
    cm = json.loads((tmp_path / "r" / "config.json").read_text())["cost_model"]
    assert cm["artifact"] == "h200-test-artifact" and cm["sha256"] == load_artifact(p)["_sha256"]
    assert main(base + ["--out", str(tmp_path / "s")]) == 0
    shipped = json.loads((tmp_path / "s" / "config.json").read_text())["cost_model"]["artifact"]
    assert shipped != "h200-test-artifact"
    # of another GPU type, or with the roofline: one error line, nothing written
    assert main([*base[:7], "1x8xH100", *base[8:], "--artifact", str(p), "--out", str(tmp_path / "t")]) == 2
    assert main(base + ["--artifact", str(p), "--cost-model", "roofline", "--out", str(tmp_path / "u")]) == 2
    assert not os.path.exists(tmp_path / "t") and not os.path.exists(tmp_path / "u")


def test_sweep_key_artifact(tmp_path):
    a = _raw()
    a["id"] = "h200-sweep-artifact"
    _write(tmp_path, a, "cal.json")
    toml = tmp_path / "s.toml"
    toml.write_text('traces = ["synthetic:jobs=20"]\npolicies = ["independent"]\nclusters = ["1x8xH200"]\n'
                    'artifact = "cal.json"\n')
    assert main(["-q", "sweep", str(toml), "--out", str(tmp_path / "sw"), "--no-progress"]) == 0
    cfgs = list((tmp_path / "sw").rglob("config.json"))
    assert cfgs and all(json.loads(c.read_text())["cost_model"]["artifact"] == "h200-sweep-artifact" for c in cfgs)
    toml.write_text(toml.read_text().replace("cal.json", "missing.json"))
    assert main(["-q", "sweep", str(toml), "--out", str(tmp_path / "sw2"), "--no-progress"]) == 2
