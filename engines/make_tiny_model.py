"""Make the tiny model real engines serve here: a random-weight Llama and a locally trained
byte-level BPE tokenizer, from a seed, with nothing downloaded.

A standalone script, run only by the engine venv's Python (it needs torch, transformers and
tokenizers, which governor's environment does not have); :func:`engines.setup.ensure_model` runs
it.  The same seed gives the same files, byte for byte (the versions are pinned in
``infra/engine-requirements.txt``).  Its shape is what vLLM's CPU attention serves: head_dim 64
(hidden 256, 4 heads; head_dim 16 was refused), 2 layers, vocabulary 512, bfloat16, a context
of 2048 tokens.

    python engines/make_tiny_model.py --out DIR [--seed N]

prints one JSON line: the directory, the seed and the tokenizer's vocabulary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: The corpus the tokenizer learns from: written here, so nothing is fetched.
CORPUS = (
    "the quick brown fox jumps over the lazy dog",
    "governor scales replicas of an inference fleet",
    "latency deadline agent request token cache",
)
VOCAB = 512
CONTEXT_TOKENS = 2048


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write the model and tokenizer to")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = ap.parse_args(argv)
    # Imported here: only the engine venv has them, and this module is also collected (doctests).
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(CORPUS) * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=2,
        intermediate_size=512,
        max_position_embeddings=CONTEXT_TOKENS,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    print(json.dumps({"out": str(out), "seed": args.seed, "vocab": len(fast)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
