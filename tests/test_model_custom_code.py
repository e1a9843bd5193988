"""A model directory whose config.json maps its model to custom code (``auto_map``, the code
``trust_remote_code`` would run) is refused by name (78) unless the class that code defines is one petal
reproduces: its ``model_type`` (jina-embeddings-v2 says ``bert``) or ``architectures`` name what the code extends,
not what it computes, and petal never runs the code. Before, such a directory embedded with stock BERT, exit 0.

Real files: the packaged MiniLM (weights linked, config.json edited), a real ``petal embed`` process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_model_dir_audit import copy_model, edit_json, petal_embed, refused

JINA_MAP = {"AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
            "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel",
            "AutoModelForMaskedLM": "jinaai/jina-bert-implementation--modeling_bert.JinaBertForMaskedLM"}

CASES = {
    # jina-embeddings-v2's config.json: model_type bert, its own architecture, ALiBi in its code
    "jina-like": dict(architectures=["JinaBertForMaskedLM"], auto_map=JINA_MAP),
    "no architectures": dict(architectures=[], auto_map={"AutoModel": "modeling.MyEncoder"}),
    # architectures names a class petal knows, but AutoModel loads another one
    "AutoModel another class": dict(auto_map={"AutoModel": "modeling_evil.EvilModel"}),
    "only AutoModelFor": dict(architectures=["MyEncoderForMaskedLM"],
                              auto_map={"AutoModelForMaskedLM": "modeling.MyEncoderForMaskedLM"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_custom_model_code_is_refused_naming_it(minilm_dir: Path, tmp_path: Path, case: str) -> None:
    model = copy_model(minilm_dir, tmp_path / "model")
    edit_json(model / "config.json", lambda c: c.update(CASES[case]))
    (model / "modeling_evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    message = refused(model, "config.json", "auto_map", "custom model code", "trust_remote_code")
    assert "Supported architectures" in message
    assert not (tmp_path / "ran").exists()


def test_the_cli_exits_78_naming_the_file(minilm_dir: Path, tmp_path: Path) -> None:
    model = copy_model(minilm_dir, tmp_path / "model")
    edit_json(model / "config.json", lambda c: c.update(CASES["jina-like"]))
    result = petal_embed("--model", str(model), "glaciers move")
    assert result.rc == 78, result.stderr
    assert f"{model / 'config.json'}: auto_map names custom model code" in result.stderr
    assert "JinaBertModel" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("auto_map", [
    {"AutoConfig": "configuration.MyConfig"},  # a config class only: the model is the registered one
    {"AutoModel": "modeling.BertModel"},  # code for a class petal reproduces
])
def test_auto_map_naming_a_class_petal_reproduces_still_embeds(minilm_dir: Path, tmp_path: Path, auto_map) -> None:
    model = copy_model(minilm_dir, tmp_path / "model")
    edit_json(model / "config.json", lambda c: c.update(auto_map=auto_map))
    result = petal_embed("--model", str(model), "glaciers move")
    assert result.rc == 0, result.stderr
