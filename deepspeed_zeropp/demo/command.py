"""The demo: DeepSpeed's bf16 crash report's training (BERT, bf16, ZeRO-3, zero_quantized_weights, 2 ranks),
without and with the patch, next to the unquantized run from the same seed. CPU by default; a GPU is used when
present."""
import time

from .launch import JobFailed, run_ranks


def _device(choice):
    if choice != "auto":
        return choice
    import torch
    return "cuda-shared" if torch.cuda.is_available() else "cpu"


def _job(patch, runs, steps, device):
    spec = {"dtype": "bf16", "patch": patch, "steps": steps, "seed": 0, "runs": runs}
    return run_ranks("deepspeed_zeropp.demo.worker", spec, world_size=2, timeout=900, device=device)


def loss_bound(reference):
    """How far a quantized run's loss may be from the unquantized one at a step: the multi-rank tests' bound."""
    return 0.02 + 0.02 * abs(reference)


def _what_it_shows(device):
    op = ("on CPU, where DeepSpeed has no compiled quantizer op, a stand-in for its fp16 op (fp16 in and out whatever "
          "the dtype, as the real one)" if device == "cpu" else "its own compiled fp16 quantizer op")
    return (f"[demo] without the patch: DeepSpeed as installed; {op}\n"
            "[demo] with the patch: deepspeed_zeropp's own kernels (pure torch on CPU); both runs beside the "
            "unquantized run from the same seed")


def run(steps=5, device="auto"):
    device = _device(device)
    print(f"[demo] 2 ranks on {device}: BertForSequenceClassification (hidden 256, 4 layers, vocabulary 2049), "
          f"bf16, ZeRO-3, zero_quantized_weights")
    print(_what_it_shows(device))
    started = time.monotonic()
    print("[demo] 1/2 without deepspeed_zeropp: zero_quantized_weights ...", flush=True)
    try:
        upstream = _job(False, [{"name": "upstream", "quantized": True}], steps, device)
    except JobFailed as error:
        upstream = {"runs": {"upstream": {"error": str(error).splitlines()[0]}}}
    unpatched = upstream["runs"]["upstream"]
    print("[demo] 2/2 with deepspeed_zeropp.patch(): unquantized baseline, then zero_quantized_weights ...",
          flush=True)
    ours = _job(True, [{"name": "baseline"}, {"name": "patched", "quantized": True}], steps, device)
    for name in ("baseline", "patched"):
        run = ours["runs"].get(name, {"error": "not run: the run before it failed"})
        if "error" in run:
            print(f"[demo] FAILED with the patch, {name} run: {run['error']}")
            return 1
    baseline, patched = ours["runs"]["baseline"], ours["runs"]["patched"]
    print(f"\nDeepSpeed {ours['deepspeed']}, torch {ours['torch']}\n")
    print(f"{'step':>4}  {'unquantized':>11}  {'patched qwZ':>11}  {'|diff|':>7}  {'bound':>6}  {'without patch':<14}")
    within = True
    for step, (ref, loss) in enumerate(zip(baseline["losses"], patched["losses"])):
        upstream_cell = (f"{unpatched['losses'][step]:.4f}"
                         if "losses" in unpatched else "failed (below)" if step == 0 else "")
        within = within and abs(loss - ref) <= loss_bound(ref)
        print(f"{step:>4}  {ref:>11.4f}  {loss:>11.4f}  {abs(loss - ref):>7.4f}  {loss_bound(ref):>6.4f}  "
              f"{upstream_cell}")
    print("\n|diff|: int8 weights (an error of up to one step, absmax/128 of a group) change every forward a little, "
          "and the two runs drift apart as they train, so a difference that grows over the steps is expected; "
          f"{'every step is' if within else 'NOT every step is'} within the bound the multi-rank tests accept "
          "(0.02 + 2% of the loss).")
    if "error" in unpatched:
        print(f"\nwithout the patch, DeepSpeed {upstream.get('deepspeed', 'as installed')} stops with: "
              f"{unpatched['error']}")
    elif unpatched.get("dtype_errors") or unpatched.get("value_errors"):
        print(f"\nwithout the patch, DeepSpeed {upstream['deepspeed']} trains, but hands parameters back wrong: "
              f"{(unpatched['dtype_errors'] + unpatched['value_errors'])[:3]}")
    else:
        print(f"\nwithout the patch, DeepSpeed {upstream['deepspeed']} trained these steps too "
              "(a release with the upstream dtype fix, through its fp16 op)")
    kept = not patched["dtype_errors"]
    print(f"\nwith the patch, dtypes at every forward: {'all bf16, as created' if kept else patched['dtype_errors']} "
          f"({patched['forward_checks']} parameter checks)")
    print(f"quantized all-gathers: {patched['counts']}")
    print("gathered weights vs the originals, at every forward before training: " +
          ("within the int8 bound" if not patched["value_errors"] else f"OUT OF BOUND {patched['value_errors']}"))
    print(f"[demo] done in {time.monotonic() - started:.0f} s")
    return 0 if kept and not patched["value_errors"] else 1
