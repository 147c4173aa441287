"""The tiny model (engines/make_tiny_model.py through engines.setup.ensure_model, issue 33 item 1):
made by the engine venv's Python from a seed, nothing downloaded, the same files for the same seed,
and loaded back by transformers as the engines load it."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from engines.setup import MODEL_STAMP, engine_env, ensure_model

pytestmark = [pytest.mark.integration, pytest.mark.engines]

_LOAD_BACK = """
import json, sys
from transformers import AutoConfig, AutoTokenizer
cfg = AutoConfig.from_pretrained(sys.argv[1])
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok.encode("governor scales replicas")
print(json.dumps({"model_type": cfg.model_type, "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
                  "layers": cfg.num_hidden_layers, "vocab": cfg.vocab_size, "context": cfg.max_position_embeddings,
                  "dtype": str(cfg.dtype), "eos": tok.eos_token, "bos": tok.bos_token, "tokenizer_vocab": len(tok),
                  "round_trip": tok.decode(ids), "ids": ids}))
"""


def _digests(model: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model.iterdir()) if p.name != MODEL_STAMP
    }


def test_the_tiny_model_is_made_from_a_seed_and_loads_back(engine_python: Path, tmp_path: Path) -> None:
    said: list[str] = []
    model = ensure_model(engine_python, tmp_path / "a", seed=0, say=said.append)
    assert model == tmp_path / "a" / "models" / "tiny-llama-s0" and said[-1].startswith("tiny model ready in")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(_digests(model))

    out = subprocess.run(
        [str(engine_python), "-c", _LOAD_BACK, str(model)], env=engine_env(), capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # head_dim 64 (256 / 4): what vLLM's CPU attention serves; bfloat16; a 2048-token context
    assert {k: got[k] for k in ("model_type", "hidden", "heads", "layers", "vocab", "context")} == {
        "model_type": "llama", "hidden": 256, "heads": 4, "layers": 2, "vocab": 512, "context": 2048,
    }  # fmt: skip
    assert got["dtype"] == "torch.bfloat16" and (got["bos"], got["eos"]) == ("<s>", "</s>")
    assert got["round_trip"] == "governor scales replicas" and max(got["ids"]) < got["tokenizer_vocab"] <= 512

    # the same seed: the same bytes (built again elsewhere); another seed: other weights, same tokenizer
    again = ensure_model(engine_python, tmp_path / "b", seed=0, say=said.append)
    assert _digests(again) == _digests(model)
    other = _digests(ensure_model(engine_python, tmp_path / "a", seed=1, say=said.append))
    assert other["model.safetensors"] != _digests(model)["model.safetensors"]
    assert other["tokenizer.json"] == _digests(model)["tokenizer.json"]

    said.clear()  # current: its stamp says so, nothing is run
    assert ensure_model(engine_python, tmp_path / "a", seed=0, say=said.append) == model and said == []
