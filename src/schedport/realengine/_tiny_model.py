"""Write a tiny, randomly initialised Llama model and a word-level tokenizer into a directory.

Run with the *server's* interpreter (it needs torch, transformers and tokenizers, which
schedport itself does not): ``python _tiny_model.py OUT_DIR [--layers N] [--hidden N] [--vocab N]``.
The model needs no download, so a vLLM CPU server can serve it on a machine without network:
enough to exercise a real engine's scheduler, batching, KV cache and streaming; its outputs
are meaningless by design.
"""

import argparse
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--max-positions", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    args.out.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, args.vocab)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.model_max_length = args.max_positions
    fast.save_pretrained(args.out)

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.max_positions,
                      bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    LlamaForCausalLM(cfg).save_pretrained(args.out)
    print(f"tiny model written to {args.out}")


if __name__ == "__main__":
    main()
