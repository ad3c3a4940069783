"""What a user of the installed package meets: the version, the license, and for each optional
dependency that is missing, an error naming the extra to install (never "this is a bug")."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardwise._errors import MissingExtraError
from shardwise._extras import EXTRAS, install_hint, require
from shardwise.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_version_flag_prints_the_installed_version():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"shardwise {version('shardwise')}"


def test_license_file_matches_pyproject():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")


@pytest.mark.parametrize("module", sorted(EXTRAS))
def test_every_extra_is_named_in_pyproject_and_in_the_hint(module):
    extra = EXTRAS[module]
    assert f"\n{extra} = [" in (ROOT / "pyproject.toml").read_text()
    assert install_hint(module) == f"pip install 'shardwise[{extra}]'"


def test_require_names_the_extra():
    with pytest.raises(MissingExtraError, match=r"pip install 'shardwise\[zarr\]'"):
        require("zarr.no_such_submodule", "reading Zarr")


MISSING = textwrap.dedent(
    """
    import json, sys
    for name in ("matplotlib", "dask", "distributed", "zarr", "torch"):
        sys.modules[name] = None  # as if not installed
    from typer.testing import CliRunner
    from shardwise.cli import app
    out = {}
    r = CliRunner()
    svg = ["explain", "nd,nd->n", "--shapes", "64x32,64x32", "--mesh", "x=8",
           "--in", "x", "--in", "x", "--svg", sys.argv[1] + "/f.svg"]
    res = r.invoke(app, svg)
    out["svg"] = [res.exit_code, res.output]
    res = r.invoke(app, ["demo", "--size", "small", "--repeat", "1"])
    out["demo"] = [res.exit_code, res.output]
    res = r.invoke(app, ["run", "nd,nd->n", sys.argv[1] + "/in.zarr", sys.argv[1] + "/in.zarr",
                         "--out", sys.argv[1] + "/o.npy"])
    out["zarr"] = [res.exit_code, res.output]
    print(json.dumps(out))
    """
)


def test_missing_extras_are_user_errors_that_name_the_extra(tmp_path):
    (tmp_path / "in.zarr").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", MISSING, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    code, text = out["svg"]
    assert code == 2 and "pip install 'shardwise[pictures]'" in " ".join(text.split())
    code, text = out["demo"]
    assert code == 0 and "skipped S5" in text
    assert "pip install 'shardwise[dask]'" in " ".join(text.split())
    code, text = out["zarr"]
    assert code == 2 and "pip install 'shardwise[zarr]'" in " ".join(text.split())
    for _, text in (out["svg"], out["demo"], out["zarr"]):
        assert "this is a bug" not in text.lower()
