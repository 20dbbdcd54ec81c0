"""Train the tiny byte-level GPT-2 shipped as model=tiny_lm, on English text every Python install has.

    python examples/train_tiny_lm.py                          # the shipped run: hookrun/models/tiny_lm/
    python examples/train_tiny_lm.py --steps 3 --out /tmp/lm  # a quick check that it runs

The text is the Python reference's prose in `pydoc_data.topics.topics` (a dict of str), its values
joined in sorted-key order, encoded as UTF-8 bytes with hookrun's ByteTokenizer ids (pad 0, bos 1,
eos 2, byte b -> b + 3), so the model reads data=text as is. The last `--held-out` fraction of the
bytes is never trained on; its loss (nats per byte) is printed. A sample is bos followed by
`n_positions - 1` bytes starting at a random offset of the training part.

Reproducible: one seed for the weights and the sample offsets, CPU only, a fixed thread count and
deterministic algorithms; two runs with the same arguments on the same torch give the same weights.
The result is written with save_pretrained (config.json, model.safetensors) plus training.json
(arguments, losses, the command, versions).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hookrun.data.text import ByteTokenizer

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "hookrun" / "models" / "tiny_lm"


def corpus() -> str:
    """The Python reference's prose: pydoc_data.topics' values in sorted-key order."""
    from pydoc_data.topics import topics
    return "".join(topics[k] for k in sorted(topics))


def split_ids(text: str, held_out: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte ids (no bos) of the training part and of the held-out tail."""
    tok = ByteTokenizer(add_bos=False)
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    cut = int(len(ids) * (1 - held_out))
    return ids[:cut], ids[cut:]


def windows(ids: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """Rows of bos + `length - 1` ids from each start."""
    body = ids[starts[:, None] + torch.arange(length - 1)]
    bos = torch.full((len(starts), 1), ByteTokenizer.bos_token_id, dtype=torch.long)
    return torch.cat([bos, body], dim=1)


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, ids: torch.Tensor, length: int, batch_size: int = 64) -> float:
    """Mean next-byte cross-entropy (nats) over the held-out ids, cut into consecutive windows of
    bos + length - 1 bytes; the bos -> first byte prediction is counted too."""
    model.eval()
    step = length - 1
    starts = torch.arange(0, len(ids) - step + 1, step)
    total, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        x = windows(ids, starts[i:i + batch_size], length)
        logits = model(input_ids=x).logits
        total += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                 reduction="sum").item()
        count += x[:, 1:].numel()
    model.train()
    return total / count


def build(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    tok = ByteTokenizer
    cfg = GPT2Config(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                     n_positions=args.n_positions, vocab_size=tok.vocab_size,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, resid_pdrop=args.dropout, embd_pdrop=args.dropout,
                     attn_pdrop=args.dropout)
    return GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    done = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    train_ids, test_ids = split_ids(corpus(), args.held_out)
    model = build(args)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wpe" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    length = args.n_positions
    initial = held_out_loss(model, test_ids, length)
    print(f"{len(train_ids)} training bytes, {len(test_ids)} held-out; held-out loss at step 0: "
          f"{initial:.4f} nats/byte", flush=True)
    log, start, running = [], time.perf_counter(), None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        starts = torch.randint(0, len(train_ids) - length + 2, (args.batch_size,), generator=gen)
        x = windows(train_ids, starts, length)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        last = step + 1 == args.steps
        if (step + 1) % args.eval_every == 0 or last:
            entry = {"step": step + 1, "train_loss": round(running, 4),
                     "held_out_loss": round(held_out_loss(model, test_ids, length), 4),
                     "seconds": round(time.perf_counter() - start, 1)}
            log.append(entry)
            print(f"step {entry['step']}: train {entry['train_loss']:.4f}, held-out "
                  f"{entry['held_out_loss']:.4f} nats/byte ({entry['seconds']} s)", flush=True)
    out = Path(args.out)
    model.save_pretrained(out, safe_serialization=True)
    import transformers
    record = {
        "command": "python examples/train_tiny_lm.py " + " ".join(sys.argv[1:]),
        "arguments": {k: v for k, v in vars(args).items() if k != "out"},
        "data": {"source": "pydoc_data.topics.topics, values joined in sorted-key order, UTF-8 bytes",
                 "python": platform.python_version(), "training_bytes": len(train_ids),
                 "held_out_bytes": len(test_ids), "held_out": f"the last {args.held_out:.0%}"},
        "held_out_loss_initial": round(initial, 4),
        "held_out_loss": log[-1]["held_out_loss"],
        "unit": "nats per byte (mean next-byte cross-entropy)",
        "log": log,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"held-out loss {record['held_out_loss']:.4f} nats/byte (from {initial:.4f}); saved to {out}")
    return record


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the folder to write (save_pretrained)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads (1: on a shared 2-core machine, 2 threads ran 3x slower)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--held-out", type=float, default=0.05, help="the fraction at the end never trained on")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-positions", type=int, default=128)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps={args.steps}; expected a whole number >= 1")
    return args


if __name__ == "__main__":
    train(parse())
