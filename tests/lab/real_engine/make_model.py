"""Write the lab's tiny Qwen3-architecture checkpoint: random weights, no download.

Run by the runtime's Python (torch, transformers and tokenizers come from the runtime's packages):

    python make_model.py OUT_DIR ARCHITECTURE CHAT_TEMPLATE

The tokenizer is byte-level (the 256 byte symbols, no merges) with Qwen's special tokens, so any
text encodes and the reasoning and tool-call parsers find the tokens they look up; the model is
Qwen3's geometry shrunk to a hidden size of 64 and 2 layers (a checkpoint of about 200 KB) with
Qwen3's 262144 positions, so Sub168's max_model_len of 256000 is valid. Its weights are drawn
from a fixed seed (every build writes the same checkpoint, and what it says is noise), but for
one property that makes the protocol probes' outcome certain: it never picks a special token
by chance (never_sampled).
"""

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]
SEED = 0


def never_sampled(model, token_ids: list[int]) -> None:
    """Make the special tokens' logits about -40 whatever the input, so that sampling never
    picks one by chance: the model never ends an answer (it writes until max_tokens, unless
    guided decoding leaves the end of text as the only choice), nor opens thinking or a tool call
    of its own. Random weights would otherwise pick each of them once in about 265 tokens, and
    a protocol probe that expects an answer cut at max_tokens would fail at random.

    One residual dimension carries a constant that no layer writes: every token's embedding
    holds 1 there, the attention and MLP output projections write 0 there. After the final norm
    that dimension is about +8 for every position, and the special tokens' output rows weigh it
    by -5.
    """
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[token_ids, 0] = -5.0


def main(out: Path, architecture: str, template: Path) -> None:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={symbol: i for i, symbol in enumerate(alphabet)},
                                   merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=template.read_text(),
    )
    tokenizer.save_pretrained(out)
    torch.manual_seed(SEED)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=262144, torch_dtype="float16", tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen3ForCausalLM(config)
    never_sampled(model, tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS))
    model.to(torch.float16).save_pretrained(out)
    # The architecture the checkpoint declares, which the engine's registry must know.
    config_path = out / "config.json"
    document = json.loads(config_path.read_text())
    document["architectures"] = [architecture]
    config_path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
