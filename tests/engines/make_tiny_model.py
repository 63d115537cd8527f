"""Build a tiny random-weight Llama and a locally trained tokenizer, with no model hub involved.

The vLLM test needs a real model that vLLM's CPU build serves fast on 2 cores: 551,552
parameters (2.2 MB), vocabulary of 1000 byte-level BPE tokens trained here on a few sentences.
Random weights make the text meaningless; requests use ``ignore_eos`` and ``max_tokens`` so
their lengths are exact. Run it with the vLLM venv's Python (it needs torch and transformers):

    python tests/engines/make_tiny_model.py $HOPLINE_VLLM_DIR/tiny
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

VOCAB_SIZE = 1000
# RoPE has no weights per position: the limit only says how long a context vLLM may allow. The
# tests serve with --max-model-len 512, except where a request must outlast a loaded API server
# (test_vllm.py's slot holders: 2048).
MAX_POSITIONS = 2048
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' + (m['content'] if m['content'] is string else '') + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def training_text() -> str:
    """A few sentences plus deterministic pseudo-words, so the BPE vocabulary fills up."""
    text = """
The quick brown fox jumps over the lazy dog. Hello world, this is a tiny model.
Observability middleware measures time to first token, queue time, prefill and decode.
A server streams tokens to the client as server sent events. Latency matters.
You are a helpful assistant. User asks a question and the assistant answers it.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000. Lorem ipsum dolor sit amet, consectetur
adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.
""" * 20
    syl = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qu", "ix", "on", "el", "ar", "st"]
    return text + " ".join(a + b + c for a in syl for b in syl for c in syl[:6]) * 3


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([training_text()], trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.model_max_length = MAX_POSITIONS
    return hf_tok


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # exactly the tokenizer's size: every sampled ID decodes
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vLLM's CPU attention supports 32, 64, 80, ...; 16 fails at the first request
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    return LlamaForCausalLM(config)


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)
    model = build_model(tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    print(f"saved {out}: vocab {len(tokenizer)}, params {sum(p.numel() for p in model.parameters())}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python make_tiny_model.py OUT_DIR")
    main(sys.argv[1])
