"""The demo: the DeepSpeed #7775 training (BERT, bf16, ZeRO-3, zero_quantized_weights, 2 ranks), without and
with the patch, next to the unquantized run from the same seed. CPU by default; a GPU is used when present."""
import time

from ._harness.launch import JobFailed, run_job


def _device(choice):
    if choice != "auto":
        return choice
    import torch
    return "cuda-shared" if torch.cuda.is_available() else "cpu"


def _job(patch, runs, steps, device):
    spec = {"model": "bert", "dtype": "bf16", "patch": patch, "steps": steps, "seed": 0, "runs": runs}
    return run_job(spec, world_size=2, timeout=900, device=device)


def run(steps=5, device="auto"):
    device = _device(device)
    print(f"[demo] 2 ranks on {device}: BertForSequenceClassification (hidden 256, 4 layers), bf16, ZeRO-3")
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
    baseline, patched = ours["runs"]["baseline"], ours["runs"]["patched"]
    if "error" in patched:
        print(f"[demo] FAILED with the patch: {patched['error']}")
        return 1
    print(f"\nDeepSpeed {ours['deepspeed']}, torch {ours['torch']}\n")
    print(f"{'step':>4}  {'unquantized':>11}  {'patched qwZ':>11}  {'|diff|':>7}  {'without patch':<14}")
    for step, (ref, loss) in enumerate(zip(baseline["losses"], patched["losses"])):
        upstream_cell = (f"{unpatched['losses'][step]:.4f}"
                         if "losses" in unpatched else "failed (below)" if step == 0 else "")
        print(f"{step:>4}  {ref:>11.4f}  {loss:>11.4f}  {abs(loss - ref):>7.4f}  {upstream_cell}")
    if "error" in unpatched:
        print(f"\nwithout the patch, DeepSpeed {upstream.get('deepspeed', '')} failed: {unpatched['error']}")
    kept = not patched["dtype_errors"]
    print(f"\ndtypes at every forward: {'all bf16, as created' if kept else patched['dtype_errors']} "
          f"({patched['forward_checks']} parameter checks)")
    print(f"quantized all-gathers: {patched['counts']}")
    print("gathered weights vs the originals, at every forward before training: " +
          ("within the int8 bound" if not patched["value_errors"] else f"OUT OF BOUND {patched['value_errors']}"))
    print(f"[demo] done in {time.monotonic() - started:.0f} s")
    return 0 if kept and not patched["value_errors"] else 1
