"""A training step loop of an ONNX model with TVM Relax training (no Django, no torch).

The job kind ``train`` of a GPU job runs this in the job's sandboxed child (``scheduling.job_process``):

1. the ONNX graph is imported with its initializers kept as function parameters
   (``from_onnx(keep_params_in_input=True)``); float initializers become the trained parameters, the
   others (shape tensors, integer tables) are bound back as constants;
2. ``tvm.relax.training.SetupTrainer`` appends a loss (MSE of the model's output against a target),
   differentiates it (``relax.transform.Gradient``) and appends the optimizer (SGD or Adam) as Relax
   functions; the module is compiled for the job's target (``llvm`` on a CPU, ``cuda`` on a GPU, where
   DLight's default GPU schedules, applied kernel by kernel, make the legalized kernels valid);
3. ``Trainer.update`` runs one step each call: forward, backward and the optimizer update, on the device.

The data is synthetic and says so: one fixed random input batch and one fixed random target (a
regression onto it), so the loss falls as the model fits that batch. What a job measures is the cost of
a real training step (forward + backward + optimizer state), not a learning result.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["OPTIMIZERS", "CompiledTrainer", "TrainingProgram", "TrainingUnsupported", "build_training_program",
           "compile_trainer", "run_training_steps"]

#: optimizer name -> default learning rate: small enough that the zoo's CNNs (fan-ins in the thousands)
#: do not overshoot on their first steps; a job may set its own.
OPTIMIZERS = {"adam": 1e-4, "sgd": 1e-4}
TARGET_SEED = 1


class TrainingUnsupported(ValueError):
    """The model cannot be trained by TVM Relax here (the message says why: an op with no gradient,
    several outputs, mixed parameter dtypes...)."""


def _optimizer(name: str, lr: float):
    from tvm.relax.training.optimizer import SGD, Adam

    class _Adam(Adam):
        # TVM 0.27's Adam passes a DataType object to numpy when it creates its step counter; a dtype
        # string is what the rest of the optimizer expects.
        def _set_params_and_dtype(self, params):
            super()._set_params_and_dtype(params)
            self.dtype = str(getattr(self.dtype, "dtype", self.dtype))

    if name == "adam":
        return _Adam(lr)
    if name == "sgd":
        return SGD(lr)
    raise TrainingUnsupported(f"unknown optimizer {name!r}; use {' or '.join(OPTIMIZERS)}")


def _is_float(dtype: Any) -> bool:
    return str(getattr(dtype, "dtype", dtype)).startswith(("float", "bfloat"))


@dataclass
class TrainingProgram:
    """A compiled trainer and its fixed batch: ``step()`` runs one training step and returns its loss."""

    trainer: Any
    inputs: list[np.ndarray]
    target: np.ndarray
    n_params: int
    n_param_values: int
    optimizer: str
    lr: float

    def step(self) -> float:
        loss = self.trainer.update(list(self.inputs), [self.target])
        return float(loss.numpy())


def _backbone(model, inputs: dict[str, np.ndarray]):
    """The ONNX model as a Relax ``backbone(inputs..., params...)`` module and its float parameters' values."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    if len(model.graph.output) != 1:
        raise TrainingUnsupported(f"a training step needs a model with one output; this one has "
                                  f"{len(model.graph.output)}")
    shapes = {k: list(v.shape) for k, v in inputs.items()}
    dtypes = {k: str(v.dtype) for k, v in inputs.items()}
    try:
        mod = from_onnx(model, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=True)
    except Exception as exc:  # noqa: BLE001 - the frontend raises many kinds
        raise TrainingUnsupported(f"TVM could not import the model: {type(exc).__name__}: {exc}") from None
    func = mod["main"]
    n_input = int(func.attrs["num_input"])
    values = [v.numpy() for v in (func.attrs["params"] if "params" in func.attrs else [])]
    param_vars = list(func.params[n_input:])
    trained = [(v, x) for v, x in zip(param_vars, values) if _is_float(v.ty.dtype)]
    fixed = {v.name: x for v, x in zip(param_vars, values) if not _is_float(v.ty.dtype)}
    if not trained:
        raise TrainingUnsupported("the model has no float parameters to train")
    if len({str(v.ty.dtype) for v, _ in trained}) > 1:
        raise TrainingUnsupported("the optimizer needs every trained parameter to have one dtype")
    func = func.without_attr("params")
    if fixed:
        try:
            func = func.bind_params(fixed)
        except Exception as exc:  # noqa: BLE001 - e.g. an int32/int64 mix in the imported shape arithmetic
            raise TrainingUnsupported(f"TVM could not fix the model's non-float initializers: "
                                      f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}") from None
    ret = func.ret_ty
    if not isinstance(ret, relax.TensorType) or not _is_float(ret.dtype):
        raise TrainingUnsupported(f"the model's output must be one float tensor, not {ret}")
    backbone = tvm.IRModule({"backbone": func.with_attr("global_symbol", "backbone")})
    backbone = backbone.with_attrs({"param_num": len(trained), "state_num": 0})
    return backbone, [x for _, x in trained], ret


def _schedule_each_for_gpu(mod, target):
    """DLight's default GPU schedules, one PrimFunc at a time: rules that fail on a kernel (in TVM 0.27
    the Reduction rule's rfactor does on some loss and optimizer reductions, and a cross-thread reduction
    of max_pool2d's backward cannot be lowered) are dropped for that kernel only, down to the Fallback
    rule, which binds a kernel's spatial loops to threads and keeps its reductions serial."""
    import tvm
    from tvm.s_tir import dlight as dl

    chains = ((dl.gpu.Matmul, dl.gpu.GEMV, dl.gpu.Reduction, dl.gpu.GeneralReduction, dl.gpu.Fallback),
              (dl.gpu.GeneralReduction, dl.gpu.Fallback), (dl.gpu.Fallback,))
    out = mod
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        last: Exception | None = None
        for rules in chains:
            try:
                with target:
                    scheduled = dl.ApplyDefaultSchedule(*(r() for r in rules))(tvm.IRModule({gv: func}))
                # a cross-thread reduction whose combiner TVM cannot match (max_pool2d's backward) fails
                # only when lowered: lower it here, and take the next, plainer rules if it does
                tvm.s_tir.transform.LowerCrossThreadReduction()(scheduled)
            except Exception as exc:  # noqa: BLE001 - TVM raises its own InternalError/TVMError kinds
                last = exc
                continue
            out.update_func(gv, scheduled[gv])
            break
        else:
            raise TrainingUnsupported(f"no GPU schedule for kernel {gv.name_hint}: {last}")
    return out


def _gpu_pipeline(target):
    """TVM's CUDA pipeline (relax.backend.cuda) with :func:`_schedule_each_for_gpu` in place of its
    single ApplyDefaultSchedule pass."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cuda import pipeline as cuda

    @tvm.transform.module_pass(opt_level=0, name="ScheduleEachForGpu")
    def schedule(mod, _ctx):
        return _schedule_each_for_gpu(mod, target)

    @tvm.transform.module_pass(opt_level=0, name="TrainingStepGpuPipeline")
    def pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential([
                *cuda.library_dispatch_passes(target), relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(), relax.transform.FuseOps(),
                relax.transform.FuseTIR(), schedule, *cuda.dataflow_lower_passes(target),
                *cuda.finalize_passes(target)])(mod)

    return pipeline


@dataclass
class CompiledTrainer:
    """A training module (``SetupTrainer``'s output), its executable for one target, the initial values of
    its trained parameters and the type of the model's output (the loss's target)."""

    train_mod: Any
    executable: Any
    params: list[np.ndarray]
    out_ty: Any


def compile_trainer(model, inputs: dict[str, np.ndarray], *, target: Any, optimizer: str = "adam",
                    lr: float | None = None) -> CompiledTrainer:
    """The ONNX ``model`` (already at its batch size) with an MSE loss, its gradient and ``optimizer``,
    compiled for ``target`` (a TVM target or its dict: ``llvm``, or ``cuda`` with per-kernel DLight
    schedules). Needs no device: a cuda executable can be built on a host without a GPU."""
    import tvm
    from tvm.relax.training import SetupTrainer
    from tvm.relax.training.loss import MSELoss

    opt = _optimizer(optimizer, OPTIMIZERS.get(optimizer, 0.0) if lr is None else float(lr))
    backbone, params, out_ty = _backbone(model, inputs)
    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    try:
        train_mod = SetupTrainer(MSELoss(reduction="mean"), opt, [out_ty, out_ty])(backbone)
    except Exception as exc:  # noqa: BLE001 - e.g. an op Relax has no gradient for
        raise TrainingUnsupported(f"TVM could not differentiate the model: {type(exc).__name__}: "
                                  f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}") from None
    compiled = train_mod.without_attr("optim_state")
    if tgt.kind.name == "llvm":
        executable = tvm.compile(compiled, target=tgt)
    else:
        executable = tvm.compile(compiled, target=tgt, relax_pipeline=_gpu_pipeline(tgt))
    return CompiledTrainer(train_mod=train_mod, executable=executable, params=params, out_ty=out_ty)


def build_training_program(model, inputs: dict[str, np.ndarray], *, target: Any, device: Any,
                           optimizer: str = "adam", lr: float | None = None) -> TrainingProgram:
    """:func:`compile_trainer`, loaded on ``device`` (``tvm.cpu()``, ``tvm.cuda(i)``) with the model's own
    initial weights and a fixed random target: ready to step."""
    from tvm import relax
    from tvm.relax.training import Trainer

    lr = OPTIMIZERS.get(optimizer, 0.0) if lr is None else float(lr)
    built = compile_trainer(model, inputs, target=target, optimizer=optimizer, lr=lr)
    trainer = Trainer(built.train_mod, relax.VirtualMachine(built.executable, device), device,
                      zero_init_param_state=False)
    trainer.load_params(built.params)
    out_ty = built.out_ty
    dtype = str(getattr(out_ty.dtype, "dtype", out_ty.dtype))
    target_values = np.random.default_rng(TARGET_SEED).standard_normal([int(d) for d in out_ty.shape]).astype(dtype)
    return TrainingProgram(trainer=trainer, inputs=list(inputs.values()), target=target_values,
                           n_params=len(built.params), n_param_values=int(sum(p.size for p in built.params)),
                           optimizer=optimizer, lr=lr)


def run_training_steps(program: TrainingProgram, steps: int, check: Callable[[], None] | None = None,
                       *, sync: Callable[[], None] | None = None) -> dict[str, Any]:
    """``steps`` training steps; ``check`` is called before each (it raises to stop the run). Returns the
    per-step wall seconds (``latencies_s``) and losses. The loss is read back every step, which also
    synchronises the device, so each step's time is its own. A loss that is not finite (the training
    diverged: a learning rate too large for the model) is None, and ``non_finite_losses`` counts them: the
    run is still a result (JSON has no NaN, and the job's answer must be JSON)."""
    latencies, losses = [], []
    for _ in range(max(1, int(steps))):
        if check is not None:
            check()
        t = time.perf_counter()
        loss = program.step()
        losses.append(loss if math.isfinite(loss) else None)
        if sync is not None:
            sync()
        latencies.append(time.perf_counter() - t)
    return {"latencies_s": latencies, "losses": losses, "loss_first": losses[0], "loss_last": losses[-1],
            "non_finite_losses": sum(loss is None for loss in losses),
            "optimizer": program.optimizer, "learning_rate": program.lr, "trained_params": program.n_params,
            "trained_param_values": program.n_param_values, "steps": len(losses), "data": "synthetic"}
