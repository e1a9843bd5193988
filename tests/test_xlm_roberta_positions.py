"""XLM-RoBERTa position ids of a text that holds the padding token itself (the text ``<pad>``): Hugging Face
numbers positions from ``padding_idx + 1`` counting only tokens that are not padding
(``create_position_ids_from_input_ids``), so such a token takes position ``padding_idx`` and the tokens after
it count on from the one before it. petal's packed model gives the same hidden states and vectors (tiny random
checkpoint, transformers and sentence-transformers as the references)."""

from __future__ import annotations

import numpy as np
import torch

from petal.engine.batch import PackedBatch
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.loader import inspect_model
from tests.tiny_models import make_model, vocab


def test_padding_tokens_inside_packed_sequences_take_hugging_faces_positions(tmp_path):
    path = tmp_path / "xlm-roberta"
    trunk = make_model("xlm-roberta", path)
    pad, bos, eos = vocab()["<pad>"], vocab()["<s>"], vocab()["</s>"]
    word = len(vocab()) - 1
    docs = [np.array(ids, dtype=np.int32) for ids in (
        [bos, word, pad, word - 1, word - 2, eos],  # one in the middle
        [bos, pad, pad, word, eos],  # two in a row, first after <s>
        [bos, word - 3, word - 4, eos],  # none: positions as before
        [bos, word, word - 1, pad, eos],  # before </s>
        [pad, word, eos],  # first
        [bos, pad, eos],
    )]
    engine = Engine(inspect_model(path), EngineConfig(token_budget=256, max_seqs=16))
    batch = PackedBatch.from_sequences(docs)
    captured: dict[str, torch.Tensor] = {}
    engine.model.register_forward_hook(lambda m, a, out: captured.setdefault("hidden", out))
    pooled = engine.embed(batch)
    for i, ids in enumerate(docs):
        with torch.no_grad():
            ref = trunk(input_ids=torch.from_numpy(ids.astype(np.int64))[None]).last_hidden_state[0]
        torch.testing.assert_close(captured["hidden"][batch.cu_seqlens[i]: batch.cu_seqlens[i + 1]], ref,
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(pooled[i], torch.nn.functional.normalize(ref[0], dim=0).numpy(), atol=1e-5)


def test_a_text_holding_pad_embeds_as_sentence_transformers_does(tmp_path):
    from sentence_transformers import SentenceTransformer

    import petal

    path = tmp_path / "xlm-roberta"
    make_model("xlm-roberta", path)
    texts = ["glaciers <pad> flow by internal deformation of the ice", "<pad> ice", "ice <pad>", "ice ice"]
    st = SentenceTransformer(str(path), device="cpu")
    reference = np.stack([st.encode([t], convert_to_numpy=True)[0] for t in texts])  # one at a time: no padding
    with petal.Embedder(str(path), device="cpu") as embedder:
        ours = np.asarray(embedder.encode(texts))
    np.testing.assert_allclose(ours, reference, atol=2e-5)
