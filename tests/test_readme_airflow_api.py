"""The README's Airflow task through the API (``petal_index`` of the PythonOperator example), as written: its
function copied out of the README, its paths moved under tmp_path. Airflow is not installed here, so its
``AirflowFailException`` is a plain exception class; the operator wiring is Airflow's, the rest is petal's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_shard
from tests.test_api import REPO, SAMPLE_DATA


class AirflowFailException(Exception):
    pass


def readme_task(tmp_path: Path):
    """``petal_index`` as the README defines it, writing under ``tmp_path``."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("def petal_index(ds: str, **_: object) -> dict:")
    code = readme[start:readme.index("\n\n\nindex = PythonOperator(", start)]
    for path in ("/data/shards", "/srv/petal", "/var/log/petal"):
        assert path in code
        code = code.replace(path, f"{tmp_path}{path}")
    (tmp_path / "var/log/petal").mkdir(parents=True)
    (tmp_path / "srv/petal").mkdir(parents=True)
    namespace: dict = {"AirflowFailException": AirflowFailException}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace["petal_index"]


def test_the_readme_airflow_task_returns_the_version_and_rows_for_xcom(tmp_path):
    task = readme_task(tmp_path)
    write_shard(tmp_path / "data/shards/2026-12-01/a.parquet",
                {"id": [1, 2, 3], "text": ["how glaciers move", "espresso at dawn", "a quiet harbour"]})
    xcom = task("2026-12-01")
    assert xcom["embedded"] == 3 and xcom["version"]
    assert json.loads((tmp_path / "var/log/petal/2026-12-01.json").read_text())["version"] == xcom["version"]


def test_the_readme_airflow_task_fails_for_good_on_bad_input(tmp_path):
    """sample_data holds 6 bad rows of 348 (1.7%), over the task's max_bad_rows="1%": exit 65, not retried."""
    task = readme_task(tmp_path)
    (tmp_path / "data/shards").mkdir(parents=True)
    (tmp_path / "data/shards/sample").symlink_to(SAMPLE_DATA)
    with pytest.raises(AirflowFailException, match="petal exit 65: "):
        task("sample")
    assert json.loads((tmp_path / "var/log/petal/sample.json").read_text())["exit_code"] == 65
