"""Build a tiny random-weight Llama model + locally trained tokenizer (no hub access).

Usage: python make_tiny_model.py <engine-dir>/tiny
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1] if len(sys.argv) > 1 else "<engine-dir>/tiny"
os.makedirs(out, exist_ok=True)

# ---- tokenizer: byte-level BPE trained on a small text written here ----
corpus = """
The quick brown fox jumps over the lazy dog. Hello world, this is a tiny model.
Observability middleware measures time to first token, queue time, prefill and decode.
A server streams tokens to the client as server sent events. Latency matters.
You are a helpful assistant. User asks a question and the assistant answers it.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000. Lorem ipsum dolor sit amet, consectetur
adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.
""" * 20
# add deterministic pseudo-words so the BPE vocab reaches ~1000 entries
syl = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qu", "ix", "on", "el", "ar", "st"]
corpus += " ".join(a + b + c for a in syl for b in syl for c in syl[:6]) * 3
special = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=1000,
    special_tokens=special,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tok.train_from_iterator([corpus], trainer=trainer)
vocab_size = tok.get_vocab_size()

hf_tok = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    bos_token="<s>",
    eos_token="</s>",
    unk_token="<unk>",
    pad_token="<pad>",
    additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
)
hf_tok.chat_template = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' + (m['content'] if m['content'] is string else '') + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
hf_tok.model_max_length = 512
hf_tok.save_pretrained(out)

# ---- model: tiny Llama with random weights ----
torch.manual_seed(0)
cfg = LlamaConfig(
    vocab_size=len(hf_tok),  # exactly the tokenizer size: every sampled id decodes
    hidden_size=128,  # vLLM CPU attention needs head_dim in {32,64,80,...}; 16 fails at run time
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    bos_token_id=hf_tok.bos_token_id,
    eos_token_id=hf_tok.eos_token_id,
    pad_token_id=hf_tok.pad_token_id,
    tie_word_embeddings=False,
    torch_dtype="float32",
)
model = LlamaForCausalLM(cfg)
model.save_pretrained(out, safe_serialization=True)
# generation_config: keep it simple; eos from config
print("saved", out, "tokenizer vocab", vocab_size, "params", sum(p.numel() for p in model.parameters()))
