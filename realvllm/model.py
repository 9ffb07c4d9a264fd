"""Build the tiny model a CPU vLLM serves in the tier: no hub access, nothing downloaded.

A random-weight Llama (2 layers, hidden size 64, one attention head) with a byte-level BPE
tokenizer trained here on a few lines of mixed-script text, and a chat template. It generates
gibberish, including byte tokens the detokeniser holds back (``"content":""`` chunks) and U+FFFD:
that is what a real vLLM sends for such tokens, so the scorer has to take it as the upstream's
text. Seeded, so every machine builds the same weights. Runs inside the real-vLLM venv (it needs
torch, transformers and tokenizers, which come with vLLM); ``python -m realvllm.model DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VERSION = "3"  # bump to rebuild cached models when the recipe changes
CORPUS = [
    "The quick brown fox jumps over the lazy dog while the stream keeps flowing.",
    "Server-sent events carry tokens: data, blank line, data, blank line, done.",
    "Le proxy coupe la connexion au milieu d'un caractère multioctet, déjà vu.",
    "Der Client liest langsam, und der Puffer füllt sich Schritt für Schritt.",
    "Прокси обрывает поток посреди ответа, клиент ждёт продолжения.",
    "中间盒在流的中间断开连接，客户端需要重试。",  # noqa: RUF001 (the full-width comma is the point)
    "ストリームが途中で切れても、クライアントは静かに失敗してはいけない。",
    "스트림이 끊기면 클라이언트는 다시 시도해야 합니다.",
    "مرحبا، هذا نص قصير لاختبار الترميز عبر البايتات.",
    "Emoji too: 🧠 ⚡ 🚀 ✅ — and quotes “like these”, KV cache, vLLM, nginx, HTTP/1.1.",
    "def handler(request): return {'id': 42, 'ok': True, 'tokens': [1, 2, 3]}",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]


def build(out: Path) -> Path:
    """Write config, weights and tokenizer to ``out`` (skipped when already built)."""
    stamp = out / ".built"
    if stamp.exists() and stamp.read_text().strip() == VERSION:
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        # One head of 64: vLLM's CPU attention kernels reject head_dim 16 ("Unsupported CPU
        # attention configuration: head_dim=16"), and 64 is one they have.
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=8192,  # rotary: no table, any length up to this
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "realvllm.json").write_text(json.dumps({"recipe": VERSION, "corpus_lines": len(CORPUS)}))
    stamp.write_text(VERSION + "\n")
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
