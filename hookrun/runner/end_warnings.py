"""What the end of a run reports: hooks that never fired, values a cast turned into inf.

    attrs = end_report(session, store, resume)   # logs a warning for each; root attributes for the file
    store.set_attrs(attrs)

A hook whose module never ran leaves no capture, which looks like success: it is named in the log
and in the file's `hooks_not_fired` attribute. A capture stored as float16 whose values exceeded
float16's range holds inf: the count is in the log and in the capture's `overflow_values`.
"""

from __future__ import annotations

import logging

from hookrun.hooks.session import HookSession, warn_never_fired
from hookrun.labels import module_label
from hookrun.output.resume import Resume
from hookrun.store.protocol import RunStore

log = logging.getLogger("hookrun")


def end_report(session: HookSession, store: RunStore, resume: Resume | None, complete: bool = True) -> dict:
    for (hook, module, role, call), n in sorted(store.overflow_by_key().items()):
        log.warning("hook %r at %s: %d value(s) of %s%s became inf when stored as the record dtype "
                    "(they exceed its range); record in float32, or set check_finite=true to stop at the first",
                    hook, module_label(module), n, role, f"@{call}" if call else "")
    unfired = {f"{p.hook}@{p.module}" for p in session.never_fired()}
    if resume is not None:  # hooks that fired in the batches kept from the old file count as fired
        recorded = {f"{key[0]}@{key[1]}" for key in store.rows_by_key()}
        old = resume.attrs.get("hooks_not_fired")
        unfired -= recorded
        if old is not None:
            unfired &= set(filter(None, str(old).split(", ")))
    names = sorted(unfired)
    for name in names if complete else ():  # (a run that stopped early may not have reached them)
        hook, module = name.split("@", 1)
        warn_never_fired(hook, module)
    skipped = {}
    for p in session.points:
        why = next((a.skipped for a in p.actions if a.skipped), None)
        if why:
            skipped[f"{p.hook}@{p.module}"] = why
            log.warning("hook %r: skipped %s, which a glob of `at:` reached: %s", p.hook, module_label(p.module), why)
    return {"hooks_not_fired": ", ".join(names), "hooks_skipped": "; ".join(f"{k} ({v})" for k, v in skipped.items())}
