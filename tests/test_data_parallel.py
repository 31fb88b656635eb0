"""``gpulab.DataParallel`` on virtual devices behaves like ``nn.DataParallel`` on real GPUs.

The measure is PyTorch's own suite, ``test/distributed/test_data_parallel.py`` in pytorch/pytorch (plus the two
namedtuple scatter/gather tests of ``test/test_cuda_multigpu.py``): whatever it checks on two GPUs that is not
about CUDA itself must hold on virtual devices. Every test here runs on n virtual devices backed by the CPU, or by
``cuda:0`` on a GPU machine (``use_virtual`` forces virtual devices where the machine has enough real GPUs), with
the model and data on ``devices.primary``, as a lesson would put them.

Ported from test_data_parallel.py (upstream name -> test here):

* test_data_parallel_buffers_requiring_grad -> test_buffers_requiring_grad_gradcheck
* test_data_parallel_rnn -> test_rnn_no_grad_forward_then_training_step
* test_data_parallel_lazy_linear -> test_lazy_module_is_refused
* test_parallel_apply -> test_parallel_apply
* test_parallel_apply_autocast, test_autocast -> test_autocast_is_carried_into_replicas (CPU autocast, bfloat16)
* test_parallel_apply_passes_exception -> test_parallel_apply_passes_exception
* test_data_parallel_multiple_input -> test_multiple_inputs_and_kwargs (``dp.data_parallel`` has no gpulab
  counterpart; the same device id lists go through ``gpulab.DataParallel``)
* test_data_parallel_small_back, test_data_parallel, TestDataParallelDeviceType.test_data_parallel_module ->
  test_output_and_gradients_for_device_orders, test_output_for_dtypes
* test_data_parallel_model_device -> test_module_must_be_on_the_source_device (a ``meta`` parameter plays the
  module "on another device")
* test_data_parallel_model_no_refcycles -> test_no_reference_cycles
* test_data_parallel_no_grad -> test_no_grad_forward, test_grad_mode_seen_by_replicas
* test_data_parallel_sparse -> test_sparse_embedding_gradients
* test_data_parallel_nested_output -> test_nested_output; test_data_parallel_nested_input -> test_nested_input
* test_data_parallel_module_zero_inputs -> test_module_with_zero_inputs
* test_data_parallel_device_args -> test_device_ids_given_as_torch_device
* test_data_parallel_function_deletion -> test_gradient_penalty_double_backward
* _test_scatter (test_scatter_cpu/gpu) -> test_scatter_backward_and_double_backward
* test_data_parallel_complex -> test_complex_parameters_and_inputs
* _test_gather (test_gather_cpu/gpu) -> test_gather_backward_and_double_backward (tensors and scalars)
* test_gather_different_len_dicts -> test_gather_dicts_of_different_lengths
* test_replicate, test_replicate_buffers -> test_replicas_compute_the_same_and_own_no_parameters
* test_zero_grad -> test_zero_grad_in_forward_warns
* test_save_replica_module -> test_save_replica_module
* test_strided_grad_layout -> test_strided_grad_layout
* test_parameter_list_dict_replica -> test_parameter_list_and_dict_in_replicas
* TestDataParallelDeviceType.test_data_parallel_module_kwargs_only{,_empty_list,_empty_dict,_empty_tuple}
  -> test_kwargs_only
* test_cuda_multigpu.py: test_scatter_namedtuple, test_gather_namedtuple, test_memory_format_scatter_gather
  -> test_scatter_namedtuple, test_gather_namedtuple, test_scatter_gather_keep_channels_last

Skipped, and why:

* ``get_device()`` checks (which GPU a replica, buffer, chunk or output lives on), in test_replicate,
  test_replicate_buffers, test_data_parallel, _test_scatter, _test_gather, test_data_parallel_module*: a virtual
  device is bookkeeping (``gpulab.memory``'s tracker), every tensor really lives on the backing device. We check
  ``virtual.current_virtual_device()`` in the replicas instead.
* The test_data_parallel_model_device cases that place the module on ``cuda:1`` with ``device_ids[0] == 0`` (or the
  reverse) should fail or succeed by GPU index: virtual devices share one backing device, so those cases do not
  exist; the "not on the source device" cases are ported with a ``meta`` parameter.
* _test_gather(-1) (gather onto the CPU with output_device -1): a CUDA-to-host destination.
* test_data_parallel_complex's expected shape ``[1, 10, 2]``: an artefact of broadcasting complex tensors as real
  views on NCCL; we check the mathematical result (complex output equal to the module's, and gradients).
* Anything about streams, NCCL, cuDNN flags, ``_check_balance``'s GPU-imbalance warning: CUDA itself.

Beyond upstream, from the project's issue: full-batch gradients for uneven chunks, chunk-sized inputs per
replica, parameter sharing and gradient summation, idle devices, BatchNorm's per-replica statistics, scatter and
gather semantics, threads, bad input, the private torch API gpulab relies on, and five SGD steps of training.

GPU checks: ``gpu`` (one
GPU: virtual devices on cuda:0) and ``gpu2`` (two GPUs: real ``nn.DataParallel``), skipped elsewhere.
"""

from __future__ import annotations

import ast
import collections
import copy
import gc
import importlib
import inspect
import io
import itertools
import re
import textwrap
import threading
import warnings
from typing import NamedTuple

import gpulab
import pytest
import torch
import torch.nn.functional as F
from gpulab import data_parallel as gdp
from gpulab import virtual
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

_devices_module = importlib.import_module("gpulab.devices")  # `gpulab.devices` itself is the function

SCALAR_WARNING = (
    "Was asked to gather along dimension 0, but all input tensors were scalars; "
    "will instead unsqueeze and return a vector."
)
NOT_ON_SOURCE = (
    "module must have its parameters and buffers on device {} (device_ids[0]) but found one of them on device: {}"
)
requires_gpu = pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
requires_gpu2 = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


@pytest.fixture(autouse=True)
def _restore_devices():
    gpulab.devices(2, quiet=True)
    yield
    gpulab.devices(2, quiet=True)


def _install(n: int, backing) -> _devices_module.Devices:
    """Make ``n`` virtual devices on ``backing`` the current choice (what ``gpulab.devices(n)`` does on 0-1 GPU)."""
    chosen = _devices_module.Devices(
        range(n), virtual=True, primary=torch.device(backing), reason=f"test: {n} virtual devices on {backing}"
    )
    _devices_module._current = chosen
    return chosen


def use_virtual(n: int) -> _devices_module.Devices:
    """``gpulab.devices(n)``; on a machine with n real GPUs, virtual devices on cuda:0 instead."""
    chosen = gpulab.devices(n, quiet=True)
    return chosen if chosen.virtual else _install(n, "cuda:0")


Seen = collections.namedtuple("Seen", "device thread shape is_replica extra")


class Probe(nn.Module):
    """A Linear layer that logs what each call sees. Replicas share the log (a replica's ``__dict__`` is a
    shallow copy of the module's), and run in threads, hence the lock."""

    def __init__(self, d_in: int = 4, d_out: int = 3, look=None):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)
        self.look = look or (lambda module, x: None)
        self.log: list[Seen] = []
        self.lock = threading.Lock()

    def forward(self, x, tag=None):
        seen = Seen(
            virtual.current_virtual_device(),
            threading.get_ident(),
            tuple(x.shape),
            getattr(self, "_is_replica", False),
            self.look(self, x),
        )
        with self.lock:
            self.log.append(seen)
        return self.linear(x)

    def by_device(self) -> list[Seen]:
        return sorted(self.log, key=lambda seen: seen.device)


def mlp(seed: int = 0, batchnorm: bool = False) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = [nn.Linear(5, 8)] + ([nn.BatchNorm1d(8)] if batchnorm else []) + [nn.Tanh(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def exact_cudnn():
    """cuDNN without TF32 or autotuning (a no-op on the CPU), so that fp32 tolerances hold on any GPU."""
    return torch.backends.cudnn.flags(enabled=True, deterministic=True, benchmark=False, allow_tf32=False)


def assert_grads_close(expected: nn.Module, actual: nn.Module, tol: float) -> None:
    for (name, p), q in zip(expected.named_parameters(), actual.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=tol, rtol=0, msg=f"gradient of {name}")


# --- the algorithm: full-batch gradients, chunks, replicas -----------------------------------------------------


@pytest.mark.parametrize(("batch", "n"), [(12, 3), (10, 3), (7, 2), (2, 4)])
def test_gradients_equal_full_batch(batch, n):
    dev = use_virtual(n).primary
    torch.manual_seed(batch * 10 + n)
    x, target = torch.randn(batch, 4, device=dev), torch.randn(batch, 3, device=dev)
    reference, model = Probe().to(dev), Probe().to(dev)
    model.load_state_dict(reference.state_dict())
    expected = reference(x)
    F.mse_loss(expected, target).backward()

    out = gpulab.DataParallel(model)(x)
    F.mse_loss(out, target).backward()

    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    assert_grads_close(reference, model, tol=1e-6)
    sizes = [len(chunk) for chunk in x.chunk(n)]  # Tensor.chunk decides, as on GPUs
    assert [(s.device, s.shape) for s in model.by_device()] == [(i, (size, 4)) for i, size in enumerate(sizes)]
    assert all(s.is_replica for s in model.log)


def test_replica_zero_shares_parameters_and_other_replicas_gradients_sum():
    dev = use_virtual(3).primary
    model = nn.Linear(4, 3).to(dev)
    twin = copy.deepcopy(model)
    dp = gpulab.DataParallel(model)
    replicas = dp.replicate(model, dp.device_ids)
    assert len(replicas) == 3
    assert replicas[0].weight.data_ptr() == model.weight.data_ptr()
    assert replicas[0].bias.data_ptr() == model.bias.data_ptr()
    for replica in replicas[1:]:
        assert replica.weight.data_ptr() != model.weight.data_ptr()
        assert torch.equal(replica.weight, model.weight)
        assert replica.weight.grad_fn is not None  # a differentiable copy, not a leaf

    xs = [torch.randn(2, 4, device=dev) for _ in replicas]
    sum(replica(x).pow(2).sum() for replica, x in zip(replicas, xs, strict=True)).backward()
    sum(twin(x).pow(2).sum() for x in xs).backward()
    assert_grads_close(twin, model, tol=1e-6)


def test_replicas_compute_the_same_and_own_no_parameters():
    dev = use_virtual(2).primary
    net = nn.Sequential(nn.Linear(10, 5), nn.BatchNorm1d(5)).to(dev)
    net.eval()
    x = torch.randn(4, 10, device=dev)
    for device_ids in [(0, 1), [0, 1]]:
        replicas = gdp.replicate(net, device_ids, source=device_ids[0])
        for i, replica in enumerate(replicas):
            torch.testing.assert_close(replica(x), net(x))
            # Since pytorch#33907 replicas expose no parameters; DDP reads _former_parameters.
            assert list(replica.parameters()) == []
            assert set(replica[0]._former_parameters) == {"weight", "bias"}
            assert replica._is_replica
            names = sorted(name for name, _ in replica.named_buffers())
            assert names == ["1.num_batches_tracked", "1.running_mean", "1.running_var"]
            for name, buffer in replica.named_buffers():
                original = net.get_buffer(name)
                assert torch.equal(buffer, original)
                assert (buffer is original) == (i == 0), f"replica {i}'s {name}: only replica 0 aliases buffers"


def test_module_attribute_and_state_dict_prefix():
    dev = use_virtual(2).primary
    model = mlp(batchnorm=True).to(dev)
    dp = gpulab.DataParallel(model)
    assert isinstance(dp, nn.DataParallel) and isinstance(dp, gdp.DataParallel)
    assert dp.module is model
    assert all(p is q for p, q in zip(dp.parameters(), model.parameters(), strict=True))
    state = dp.state_dict()
    assert list(state) == [f"module.{key}" for key in model.state_dict()]
    assert list(state) == list(nn.DataParallel(copy.deepcopy(model)).state_dict())  # PyTorch's own naming
    consume_prefix_in_state_dict_if_present(state, "module.")
    fresh = mlp(seed=1, batchnorm=True).to(dev)
    fresh.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True))


def test_idle_devices_for_tiny_batches():
    dev = use_virtual(4).primary
    model = Probe().to(dev)
    dp = gpulab.DataParallel(model)
    out = dp(torch.randn(2, 4, device=dev), "not a tensor")  # repeated for 4 devices, but zip stops at 2 chunks
    assert out.shape == (2, 3)
    assert [(s.device, s.shape) for s in model.by_device()] == [(0, (1, 4)), (1, (1, 4))]

    model.log.clear()
    out = dp(torch.randn(1, 4, device=dev))
    assert out.shape == (1, 3)
    assert len(model.log) == 1, "one sample: one replica, called once"
    assert model.log[0].device == 0 and model.log[0].thread == threading.get_ident()  # inline, as PyTorch does


def test_empty_batch():
    dev = use_virtual(2).primary
    assert gpulab.DataParallel(nn.Linear(4, 3).to(dev))(torch.empty(0, 4, device=dev)).shape == (0, 3)


def test_tied_and_unused_parameters():
    dev = use_virtual(2).primary

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False)
            self.second.weight = self.first.weight  # tied: one parameter, two modules
            self.unused = nn.Linear(3, 3)
            self.norm = nn.BatchNorm1d(3, track_running_stats=False)  # None buffers

        def forward(self, x):
            return self.norm(self.second(self.first(x)))

    torch.manual_seed(0)
    model = Net().to(dev)
    twin = copy.deepcopy(model)
    x = torch.randn(6, 3, device=dev)
    gpulab.DataParallel(model)(x).pow(2).sum().backward()
    torch.cat([twin(chunk) for chunk in x.chunk(2)]).pow(2).sum().backward()  # BatchNorm: per-chunk statistics
    torch.testing.assert_close(model.first.weight.grad, twin.first.weight.grad)
    # The replicas' Broadcast gets zero gradients for outputs that were not used (autograd materialises
    # them), so unused parameters get zeros rather than None, as with nn.DataParallel.
    assert twin.unused.weight.grad is None
    assert torch.equal(model.unused.weight.grad, torch.zeros(3, 3, device=dev))


def test_single_device_calls_the_module_itself():
    dev = use_virtual(2).primary
    model = Probe().to(dev)
    out = gpulab.DataParallel(model, device_ids=[1])(torch.randn(5, 4, device=dev))
    assert out.shape == (5, 3)
    assert len(model.log) == 1 and not model.log[0].is_replica and model.log[0].shape == (5, 4)


# --- BatchNorm: per-replica statistics ----------------------------------------------------------------------


def test_batchnorm_statistics_are_per_replica_and_only_replica_zero_updates_running_stats():
    dev = use_virtual(2).primary
    torch.manual_seed(0)
    x = (torch.randn(10, 3) * 2 + 1).to(dev)
    bn = nn.BatchNorm1d(3).to(dev)
    out = gpulab.DataParallel(bn)(x)

    full = nn.BatchNorm1d(3).to(dev)(x)
    assert not torch.allclose(out, full, atol=1e-3), "per-chunk statistics must differ from full-batch ones"
    chunks = x.chunk(2)
    per_chunk = torch.cat([F.batch_norm(chunk, None, None, training=True) for chunk in chunks])
    torch.testing.assert_close(out, per_chunk)

    chunk0 = chunks[0]
    torch.testing.assert_close(bn.running_mean, 0.1 * chunk0.mean(0))
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * chunk0.var(0, unbiased=True))
    assert bn.num_batches_tracked.item() == 1
    assert not torch.allclose(bn.running_mean, 0.1 * x.mean(0), atol=1e-3)


def test_batchnorm_in_eval_mode_matches_full_batch():
    dev = use_virtual(3).primary
    bn = nn.BatchNorm1d(3).to(dev)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.eval()
    x = torch.randn(10, 3, device=dev)
    torch.testing.assert_close(gpulab.DataParallel(bn)(x), bn(x))


def test_batchnorm_chunk_of_one_sample_raises_in_training():
    dev = use_virtual(2).primary
    with pytest.raises(ValueError, match="Expected more than 1 value per channel") as direct:
        nn.BatchNorm1d(3).to(dev)(torch.randn(1, 3, device=dev))
    dp = gpulab.DataParallel(nn.BatchNorm1d(3).to(dev))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel") as replicated:
        dp(torch.randn(3, 3, device=dev))  # chunks of 2 and 1
    assert "in replica 1" in str(replicated.value)
    assert str(direct.value).splitlines()[0] in str(replicated.value)


# --- scatter ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "n"), [(10, 3), (12, 3), (4, 3), (2, 4), (1, 2), (7, 1), (0, 2)])
def test_scatter_chunk_semantics(batch, n):
    x = torch.arange(batch * 2.0).view(batch, 2)
    chunks = gdp.scatter(x, list(range(n)), 0, 0)
    expected = x.chunk(n)
    assert [len(c) for c in chunks] == [len(e) for e in expected]
    assert all(torch.equal(c, e) for c, e in zip(chunks, expected, strict=True))
    if (batch, n) == (10, 3):
        assert [len(c) for c in chunks] == [4, 4, 2]


def test_scatter_backward_and_double_backward():
    x = torch.randn(4, 4, dtype=torch.double, requires_grad=True)
    result = gdp.scatter(x, (0, 1), 0, 0)
    assert len(result) == 2
    assert torch.equal(result[0], x[:2]) and torch.equal(result[1], x[2:])
    assert result[0].data_ptr() == x.data_ptr(), "the source device's chunk is a view, as in comm.scatter"
    assert result[1].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    grad = result[0].detach().clone().fill_(2)
    result[0].backward(grad)
    assert torch.equal(x.grad[:2], grad) and torch.equal(x.grad[2:], torch.zeros_like(grad))
    assert torch.autograd.gradcheck(lambda y: tuple(gdp.scatter(y, (0, 1), 0, 0)), (x,))
    assert torch.autograd.gradgradcheck(lambda y: tuple(gdp.scatter(y, (0, 1), 0, 0)), (x,))


def test_scatter_containers_split_elementwise_and_other_objects_repeated():
    Pair = collections.namedtuple("Pair", "a b")
    a, b = torch.arange(10.0), torch.arange(20.0).view(10, 2)
    marker = object()
    inputs = (a, [b, "text", 3], {"k": a, "none": None}, Pair(a, b), collections.OrderedDict(z=b), marker)
    out = gdp.scatter(inputs, [0, 1, 2], 0, 0)
    assert len(out) == 3
    for i, (t, lst, dct, pair, odict, obj) in enumerate(out):
        assert isinstance(out[i], tuple)
        assert torch.equal(t, a.chunk(3)[i])
        assert isinstance(lst, list) and torch.equal(lst[0], b.chunk(3)[i]) and lst[1:] == ["text", 3]
        assert type(dct) is dict and torch.equal(dct["k"], a.chunk(3)[i]) and dct["none"] is None
        assert type(pair) is Pair and torch.equal(pair.a, a.chunk(3)[i]) and torch.equal(pair.b, b.chunk(3)[i])
        assert type(odict) is collections.OrderedDict and torch.equal(odict["z"], b.chunk(3)[i])
        assert obj is marker


def test_scatter_namedtuple():
    fields = ("a", "b")
    Plain = collections.namedtuple("NamedTuple", fields)

    class Typed(NamedTuple):
        a: torch.Tensor
        b: torch.Tensor

    for kind in (Plain, Typed):
        a, b = torch.rand(4), torch.rand(4)
        for i, x in enumerate(gdp.scatter(kind(a, b), [0, 1], 0, 0)):
            assert isinstance(x, kind) and x._fields == fields
            assert torch.equal(x.a, a[2 * i : 2 * i + 2]) and torch.equal(x.b, b[2 * i : 2 * i + 2])


def test_scatter_kwargs_like_scatter_kwargs():
    dev = use_virtual(3).primary
    dp = gpulab.DataParallel(nn.Identity())
    x, y = torch.randn(10, 2, device=dev), torch.randn(10, 5, device=dev)
    inputs, kwargs = dp.scatter((x, "flag"), {"y": y, "mode": 7}, dp.device_ids)
    assert isinstance(inputs, tuple) and isinstance(kwargs, tuple) and len(inputs) == len(kwargs) == 3
    for i, ((xi, flag), kw) in enumerate(zip(inputs, kwargs, strict=True)):
        assert torch.equal(xi, x.chunk(3)[i]) and flag == "flag"
        assert torch.equal(kw["y"], y.chunk(3)[i]) and kw["mode"] == 7
    inputs, kwargs = dp.scatter((), {"y": y}, dp.device_ids)
    assert inputs == ((), (), ()) and [len(kw["y"]) for kw in kwargs] == [4, 4, 2]
    inputs, kwargs = dp.scatter((x,), {}, dp.device_ids)
    assert kwargs == ({}, {}, {})


def test_dim_1_scatters_and_gathers_along_dim_1():
    dev = use_virtual(3).primary

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.tensor(2.0, device=dev))
            self.seen = []
            self.lock = threading.Lock()

        def forward(self, x):
            with self.lock:
                self.seen.append((virtual.current_virtual_device(), tuple(x.shape)))
            return x * self.w

    model = Scale()
    x = torch.randn(10, 8, device=dev)  # 8 columns over 3 devices: 3, 3, 2
    out = gpulab.DataParallel(model, dim=1)(x)
    torch.testing.assert_close(out, x * 2)
    assert sorted(model.seen) == [(0, (10, 3)), (1, (10, 3)), (2, (10, 2))]
    out.sum().backward()
    torch.testing.assert_close(model.w.grad, x.sum())


def test_scatter_gather_keep_channels_last():
    nhwc = torch.randn(10, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    results = gdp.scatter(nhwc, (0, 1), 0, 0)
    for result in results:
        assert not result.is_contiguous() and result.is_contiguous(memory_format=torch.channels_last)
    assert gdp.gather(results, 0, (0, 1)).is_contiguous(memory_format=torch.channels_last)


# --- gather -----------------------------------------------------------------------------------------------------


def _torch_scalar_warning() -> str:
    """The message of PyTorch's own warning, read from ``torch.nn.parallel._functions.Gather.forward``."""
    from torch.nn.parallel import _functions

    tree = ast.parse(textwrap.dedent(inspect.getsource(_functions.Gather.forward)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "warnings.warn":
            return ast.literal_eval(node.args[0])
    raise AssertionError("torch.nn.parallel._functions.Gather.forward no longer warns about scalars")


def test_gather_scalar_warning_is_pytorchs():
    assert _torch_scalar_warning() == SCALAR_WARNING
    dev = use_virtual(3).primary
    model = mlp().to(dev)
    twin = copy.deepcopy(model)

    class WithLoss(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, y):
            return F.mse_loss(self.inner(x), y, reduction="sum")

    x, y = torch.randn(12, 5, device=dev), torch.randn(12, 3, device=dev)
    with pytest.warns(UserWarning, match=re.escape(SCALAR_WARNING)) as record:
        losses = gpulab.DataParallel(WithLoss(model))(x, y)
    assert [str(w.message) for w in record if "gather" in str(w.message)] == [SCALAR_WARNING]
    assert losses.shape == (3,)
    losses.sum().backward()
    F.mse_loss(twin(x), y, reduction="sum").backward()
    assert_grads_close(twin, model, tol=1e-5)


def test_gather_backward_and_double_backward():
    inputs = (
        torch.randn(2, 4, dtype=torch.double, requires_grad=True),
        torch.randn(2, 4, dtype=torch.double, requires_grad=True),
    )
    result = gdp.gather(inputs, 0, (0, 1))
    assert result.shape == (4, 4)
    assert torch.equal(result[:2], inputs[0]) and torch.equal(result[2:], inputs[1])
    grad = torch.randn(4, 4, dtype=torch.double)
    result.backward(grad)
    assert torch.equal(inputs[0].grad, grad[:2]) and torch.equal(inputs[1].grad, grad[2:])
    assert torch.autograd.gradcheck(lambda a, b: gdp.gather((a, b), 0, (0, 1)), inputs)
    assert torch.autograd.gradgradcheck(lambda a, b: gdp.gather((a, b), 0, (0, 1)), inputs)

    scalars = (
        torch.randn((), dtype=torch.double, requires_grad=True),
        torch.randn((), dtype=torch.double, requires_grad=True),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape(SCALAR_WARNING))
        result = gdp.gather(scalars, 0, (0, 1))
        assert result.shape == (2,)
        assert torch.equal(result[0], scalars[0]) and torch.equal(result[1], scalars[1])
        grad = torch.randn(2, dtype=torch.double)
        result.backward(grad)
        assert torch.equal(scalars[0].grad, grad[0]) and torch.equal(scalars[1].grad, grad[1])
        assert torch.autograd.gradcheck(lambda a, b: gdp.gather((a, b), 0, (0, 1)), scalars)
        assert torch.autograd.gradgradcheck(lambda a, b: gdp.gather((a, b), 0, (0, 1)), scalars)


def test_nested_output():
    dev = use_virtual(2).primary

    def fn(x):
        return [x, (x.sin(), x.cos(), [x.add(1)]), x, collections.OrderedDict(a=x, b=[x.sin()])]

    class Net(nn.Module):
        def forward(self, x):
            return fn(x)

    i = torch.randn(2, 2, device=dev)
    output = gpulab.DataParallel(Net())(i)
    torch.testing.assert_close(output, fn(i))
    assert isinstance(output, list) and isinstance(output[1], tuple) and isinstance(output[1][2], list)
    assert isinstance(output[3], collections.OrderedDict) and list(output[3]) == ["a", "b"]
    assert isinstance(output[3]["b"], list) and isinstance(output[3]["b"][0], torch.Tensor)


def test_dict_namedtuple_and_none_outputs():
    dev = use_virtual(3).primary
    Out = collections.namedtuple("Out", "logits aux")

    class Net(nn.Module):
        def forward(self, x):
            return {"pair": Out(x * 2, None), "none": None, "sum": x.sum(1, keepdim=True)}

    x = torch.randn(7, 2, device=dev)
    out = gpulab.DataParallel(Net())(x)
    assert type(out) is dict and list(out) == ["pair", "none", "sum"]
    assert type(out["pair"]) is Out and out["pair"].aux is None and out["none"] is None
    torch.testing.assert_close(out["pair"].logits, x * 2)
    torch.testing.assert_close(out["sum"], x.sum(1, keepdim=True))


def test_gather_namedtuple():
    fields = ["a", "b"]
    Plain = collections.namedtuple("NamedTuple", fields)

    class Typed(NamedTuple):
        a: torch.Tensor
        b: torch.Tensor

    for kind in (Plain, Typed):
        outputs = [kind(torch.rand(4), torch.rand(4)), kind(torch.rand(4), torch.rand(4))]
        out = gdp.gather(outputs, 0, (0, 1))
        assert isinstance(out, kind)
        for i, x in enumerate(out):
            assert isinstance(x, torch.Tensor)
            assert torch.equal(x, torch.cat((outputs[0][i], outputs[1][i])))


def test_gather_dicts_of_different_lengths():
    inputs = ({"a": torch.randn(1, 2)}, {"b": torch.randn(1, 2), "a": torch.randn(1, 2)})
    with pytest.raises(ValueError, match="All dicts must have the same number of keys"):
        gdp.gather(inputs, 0, (0, 1))


# --- parallel_apply: threads, exceptions, grad mode, autocast ----------------------------------------------------


def test_parallel_apply():
    dev = use_virtual(2).primary
    l1, l2 = nn.Linear(10, 5).to(dev), nn.Linear(10, 5).to(dev)
    i1, i2 = torch.randn(2, 10, device=dev), torch.randn(2, 10, device=dev)
    expected = (l1(i1), l2(i2))
    # each input can be either a collection of positional arguments or the single argument itself
    for inputs in [((i1,), (i2,)), (i1, i2)]:
        outputs = gdp.parallel_apply((l1, l2), inputs, None, [0, 1], dev.type)
        for out, exp in zip(outputs, expected, strict=True):
            torch.testing.assert_close(out, exp)


class _RaisesKeyError(nn.Module):
    def forward(self, *args):
        return {}["wonderful"]


def test_parallel_apply_passes_exception():
    # upstream's pattern, and its set-up: one module twice on one device ("we can use a single device twice")
    pattern = r"Caught KeyError in replica \d on device 0.\nOriginal Traceback[\s\S]+wonderful"
    module = _RaisesKeyError()
    with pytest.raises(KeyError, match=pattern):
        gdp.parallel_apply((module, module), (None, None), None, [0, 0])
    with pytest.raises(KeyError, match=r"Caught KeyError in replica \d on device \d.\nOriginal Traceback"):
        gdp.parallel_apply((module, module), (None, None), None, [0, 1])


def test_replica_exception_is_reraised_naming_the_replica():
    dev = use_virtual(3).primary

    class FailsOnDevice1(nn.Module):
        def forward(self, x):
            if virtual.current_virtual_device() == 1:
                raise ValueError("replica-specific failure")
            return x

    with pytest.raises(ValueError, match="in replica 1") as info:
        gpulab.DataParallel(FailsOnDevice1())(torch.randn(6, 2, device=dev))
    message = str(info.value)
    assert re.search(r"Caught ValueError in replica 1 on device 1\.\nOriginal Traceback", message)
    assert "replica-specific failure" in message and "in forward" in message  # the replica's own traceback

    class OddError(Exception):
        def __init__(self, code, detail):
            super().__init__(code, detail)

    class RaisesOdd(nn.Module):
        def forward(self, x):
            raise OddError(3, "odd")

    with pytest.raises(RuntimeError, match=r"Caught OddError in replica \d"):
        gpulab.DataParallel(RaisesOdd())(torch.randn(4, 2, device=dev))


def test_one_thread_per_replica():
    dev = use_virtual(3).primary
    barrier = threading.Barrier(3, timeout=10)  # passes only if the three replicas run at the same time
    model = Probe(look=lambda module, x: barrier.wait()).to(dev)
    gpulab.DataParallel(model)(torch.randn(6, 4, device=dev))
    threads = [s.thread for s in model.log]
    assert len(threads) == 3 and len(set(threads)) == 3
    assert threading.get_ident() not in threads


def test_no_grad_forward():
    dev = use_virtual(3).primary
    model = Probe(look=lambda module, x: (torch.is_grad_enabled(), module.linear.weight)).to(dev)
    with torch.no_grad():
        out = gpulab.DataParallel(model)(torch.randn(6, 4, device=dev))
    assert out.grad_fn is None and not out.requires_grad
    seen = model.by_device()
    assert [s.extra[0] for s in seen] == [False, False, False]
    assert seen[0].extra[1] is model.linear.weight  # replicate(detach=True): device 0 gets the tensors themselves
    for s in seen[1:]:
        assert not s.extra[1].requires_grad and s.extra[1].grad_fn is None  # detached copies


def test_grad_mode_seen_by_replicas():
    dev = use_virtual(2).primary

    class Layer(nn.Module):
        def forward(self, x):
            assert not torch.is_grad_enabled()
            return x

    layer = Layer()
    x = torch.randn(20, 10, device=dev)
    with torch.no_grad():
        gpulab.DataParallel(layer)(x)
    with pytest.raises(AssertionError):
        gpulab.DataParallel(layer)(x)


_FAST = {"cpu": torch.bfloat16, "cuda": torch.float16}  # each device type's default autocast dtype
_OTHER = {"cpu": torch.float16, "cuda": torch.bfloat16}


def test_autocast_is_carried_into_replicas():
    dev = use_virtual(2).primary
    fast = _FAST[dev.type]
    l1, l2 = nn.Linear(10, 5).to(dev), nn.Linear(10, 5).to(dev)
    i1, i2 = torch.randn(2, 10, device=dev), torch.randn(2, 10, device=dev)
    with torch.autocast(dev.type):
        expected = (l1(i1), l2(i2))
    for inputs in [((i1,), (i2,)), (i1, i2)]:
        with torch.autocast(dev.type):
            outputs = gdp.parallel_apply((l1, l2), inputs, None, [0, 1], dev.type)
        for out, exp in zip(outputs, expected, strict=True):
            assert out.dtype == exp.dtype == fast
            torch.testing.assert_close(out, exp)

    model = Probe(d_in=8, d_out=8, look=lambda module, x: torch.is_autocast_enabled(dev.type)).to(dev)
    with torch.autocast(dev.type):
        out = gpulab.DataParallel(model)(torch.randn(8, 8, device=dev))
    assert out.dtype == fast and [s.extra for s in model.log] == [True, True]

    class Decorated(nn.Linear):  # test_autocast: autocast inside the module's forward
        @torch.autocast(dev.type)
        def forward(self, x):
            return super().forward(x)

    assert gpulab.DataParallel(Decorated(8, 8).to(dev))(torch.randn(8, 8, device=dev)).dtype == fast


def test_autocast_dtype_is_carried_into_replicas():
    dev = use_virtual(2).primary
    other = _OTHER[dev.type]
    model = nn.Linear(8, 8).to(dev)
    x = torch.randn(8, 8, device=dev)
    with torch.autocast(dev.type, dtype=other):
        expected = model(x)
        out = gpulab.DataParallel(model)(x)
    assert expected.dtype == other
    assert out.dtype == other


# --- inputs and outputs of every kind (ported) -------------------------------------------------------------------


def test_multiple_inputs_and_kwargs():
    dev = use_virtual(2).primary

    class TestModule(nn.Module):
        def forward(self, var1, var2, float1, var3=None):
            if var3 is None:
                return float1 * (var1 * var2)
            return float1 * (var1 * var2 + var3)

    var1 = torch.randn(5, 5, device=dev, requires_grad=True)
    var2 = torch.randn(5, 5, device=dev, requires_grad=True)
    var3 = torch.randn(5, 5, device=dev)
    float1 = torch.randn(1).item()

    for kwargs in ({}, {"var3": var3}):
        expected = TestModule()(var1, var2, float1, **kwargs)
        g1, g2 = torch.autograd.grad(expected.sum(), (var1, var2))
        for device_ids in [(0, 1), (1, 0), (0,), None]:
            out = gpulab.DataParallel(TestModule(), device_ids=device_ids)(var1, var2, float1, **kwargs)
            torch.testing.assert_close(out, expected)
            got1, got2 = torch.autograd.grad(out.sum(), (var1, var2))
            torch.testing.assert_close(got1, g1)
            torch.testing.assert_close(got2, g2)


def test_output_and_gradients_for_device_orders():
    dev = use_virtual(2).primary
    model = nn.Linear(10, 5).to(dev)
    i = torch.randn(20, 10, device=dev)
    expected_out = model(i)
    expected_grads = torch.autograd.grad(expected_out.sum(), list(model.parameters()))
    for device_ids in [(0, 1), (1, 0), None]:
        model.zero_grad()
        dp = gpulab.DataParallel(model, device_ids=device_ids)
        out = dp(i)
        out.sum().backward()
        torch.testing.assert_close(out, expected_out)
        for expected, param in zip(expected_grads, model.parameters(), strict=True):
            torch.testing.assert_close(param.grad, expected)
        assert dp.output_device == (device_ids or (0,))[0]


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float, 1e-5), (torch.double, 1e-5), (torch.half, 1e-2)])
def test_output_for_dtypes(dtype, atol):
    dev = use_virtual(2).primary
    model = nn.Linear(10, 5).to(dev, dtype)
    i = torch.randn(20, 10, device=dev, dtype=dtype)
    out = gpulab.DataParallel(model)(i)
    assert out.dtype == dtype
    torch.testing.assert_close(out, model(i), atol=atol, rtol=0)


def test_nested_input():
    dev = use_virtual(2).primary

    class Net(nn.Module):
        def forward(self, *inputs):
            return inputs[1][0]

    i = torch.randn(20, 3, device=dev)
    inputs = (i.cos(), (i.sin(), i), i.sin())
    torch.testing.assert_close(gpulab.DataParallel(Net())(*inputs), i.sin())


@pytest.mark.parametrize("unused", [None, [], {}, ()], ids=["plain", "empty_list", "empty_dict", "empty_tuple"])
def test_kwargs_only(unused):
    dev = use_virtual(2).primary
    linear = nn.Linear(10, 5).to(dev)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = linear

        def forward(self, input):
            return self.l(input if unused is None else input["data"])

    i = torch.randn(20, 10, device=dev)
    out = gpulab.DataParallel(Net())(input=i if unused is None else {"data": i, "unused": unused})
    torch.testing.assert_close(out, linear(i))


def test_module_with_zero_inputs():
    dev = use_virtual(2).primary

    class TestModule(nn.Module):
        def forward(self):
            t = torch.eye(2, 3, device=dev)
            return t + (1 - t)

    for device_ids in ([0], [0, 1]):
        torch.testing.assert_close(gpulab.DataParallel(TestModule(), device_ids)(), torch.ones(2, 3, device=dev))


def test_device_ids_given_as_torch_device():
    dev = use_virtual(2).primary
    cuda0, cuda1 = torch.device("cuda:0"), torch.device("cuda", 1)  # only indices matter; no GPU needed
    model = nn.Linear(10, 5).to(dev)
    i = torch.randn(20, 10, device=dev, requires_grad=True)
    dp = gpulab.DataParallel(model, device_ids=(0, 1), output_device=cuda0)
    torch.testing.assert_close(dp(i), model(i))
    dp = gpulab.DataParallel(model, device_ids=(cuda0, cuda1), output_device=cuda0)
    assert dp.device_ids == [0, 1] and dp.output_device == 0
    torch.testing.assert_close(dp(i), model(i))
    assert gpulab.DataParallel(model, device_ids=["cuda:1", "cuda:0"]).device_ids == [1, 0]


def test_buffers_requiring_grad_gradcheck():
    dev = use_virtual(2).primary

    class TestModule(nn.Module):
        def __init__(self, t):
            super().__init__()
            self.register_buffer("t_rg", t)
            self.register_buffer("t_not_rg", t.clone().detach())

        def forward(self, x):
            return x * self.t_rg + self.t_not_rg

    m = TestModule(torch.randn(100, device=dev, dtype=torch.double, requires_grad=True))
    assert m.t_rg.requires_grad
    dpm = gpulab.DataParallel(m, [0, 1])
    inp = torch.randn(2, 100, device=dev, dtype=torch.double)
    assert torch.autograd.gradcheck(lambda t: dpm(inp), (m.t_rg,), check_batched_grad=False)


def test_rnn_no_grad_forward_then_training_step():
    dev = use_virtual(2).primary

    class TestModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(6, 8, 1, batch_first=True, bidirectional=True)

        def forward(self, x):
            self.rnn.flatten_parameters()
            return self.rnn(x)

    def step(model):
        opt = torch.optim.SGD(model.parameters(), lr=10)
        output = model(torch.ones(4, 4, 6, device=dev))
        F.mse_loss(output[0], torch.zeros_like(output[0])).backward()
        opt.step()

    torch.manual_seed(0)
    with exact_cudnn():
        with torch.no_grad():
            model = TestModule().to(dev)
            model_dp = gpulab.DataParallel(copy.deepcopy(model))
            model_dp(torch.rand(2, 4, 6, device=dev))  # must not crash with grad disabled (pytorch#21108)
        step(model)
        step(model_dp)
    for p1, p2 in zip(model.parameters(), model_dp.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, atol=1e-5, rtol=1e-5)


def test_lazy_module_is_refused():
    dev = use_virtual(2).primary
    # upstream: assertRaisesRegex(RuntimeError, "Modules with uninitialized parameters") (torch/nn/modules/lazy.py)
    with pytest.raises(RuntimeError, match="Modules with uninitialized parameters"):
        gpulab.DataParallel(nn.LazyLinear(10).to(dev))(torch.rand(10, 10, device=dev))


def test_sparse_embedding_gradients():
    dev = use_virtual(2).primary
    model = nn.Embedding(10, 5, sparse=True).to(dev)
    i = torch.randint(10, (20, 5), device=dev)
    expected_out = model(i)
    expected_out.sum().backward()
    expected_grad = model.weight.grad.clone()
    for device_ids in [(0, 1), (1, 0)]:
        model.zero_grad()
        out = gpulab.DataParallel(model, device_ids)(i)
        out.sum().backward()
        torch.testing.assert_close(out, expected_out)
        assert model.weight.grad.is_sparse
        torch.testing.assert_close(model.weight.grad.coalesce(), expected_grad.coalesce())


def test_complex_parameters_and_inputs():
    dev = use_virtual(2).primary

    class Cplx(nn.Module):
        def __init__(self):
            super().__init__()
            self.cplx = nn.Parameter(torch.randn(1, 10, dtype=torch.cfloat))

        def forward(self, x):
            return x * self.cplx

    model = Cplx().to(dev)
    twin = copy.deepcopy(model)
    x = torch.rand(5, 10, dtype=torch.cfloat, device=dev)
    result = gpulab.DataParallel(model)(x)
    assert result.dtype == torch.cfloat and result.shape == (5, 10)
    torch.testing.assert_close(result, twin(x))
    result.abs().sum().backward()
    twin(x).abs().sum().backward()
    torch.testing.assert_close(model.cplx.grad, twin.cplx.grad)


def test_gradient_penalty_double_backward():
    dev = use_virtual(2).primary
    net = nn.Linear(4, 1).to(dev)
    dpn = gpulab.DataParallel(net, [0, 1])
    x = torch.ones(2, 4, device=dev, requires_grad=True)
    output = dpn(x)
    penalty = torch.autograd.grad(
        outputs=output, inputs=x, grad_outputs=x.new_ones(output.size()), create_graph=True, retain_graph=True
    )[0].mean()
    penalty.backward()
    grads = [p.grad for p in net.parameters()]
    torch.testing.assert_close(grads[0], torch.full((1, 4), 0.25, device=dev))
    torch.testing.assert_close(grads[1], torch.zeros(1, device=dev))


def test_zero_grad_in_forward_warns():
    dev = use_virtual(2).primary

    class Net(nn.Module):
        def forward(self, x):
            self.zero_grad()
            return x

    with pytest.warns(UserWarning, match=r"Calling \.zero_grad\(\) from a module created with nn\.DataParallel"):
        gpulab.DataParallel(Net())(torch.rand(4, 3, device=dev))


def test_save_replica_module():
    dev = use_virtual(2).primary
    module = nn.Linear(8, 8).to(dev)
    for detach in (False, True):
        replicas = gdp.replicate(module, [0, 1], 0, detach=detach)
        torch.save(replicas, io.BytesIO())


def test_strided_grad_layout():
    dev = use_virtual(2).primary

    class ConvNet(nn.Module):
        def __init__(self, layouts, dtypes):
            super().__init__()
            self.dtypes = dtypes
            channels = [8, 16, 32, 16, 8]
            for k in range(4):
                conv = nn.Conv2d(channels[k], channels[k + 1], (2, 2))
                setattr(self, f"conv{k}", conv.to(memory_format=layouts[k], dtype=dtypes[k]))

        def forward(self, x):
            x = x.to(self.dtypes[0])
            for k in range(4):
                x = getattr(self, f"conv{k}")(x)
                x = x.to(self.dtypes[k + 1]) if k < 3 else x
            return x

    formats = (
        [torch.contiguous_format] * 4,
        [torch.channels_last] * 2 + [torch.contiguous_format] * 2,
        [torch.channels_last] * 4,
    )
    dtype_lists = ([torch.float] * 4, [torch.float] * 2 + [torch.half] * 2)
    torch.manual_seed(0)
    inp = torch.randn(8, 8, 8, 8, device=dev)
    target = torch.randn(8, 8, 4, 4, device=dev)
    with exact_cudnn():
        for layouts, dtypes in itertools.product(formats, dtype_lists):
            m = ConvNet(layouts, dtypes).to(dev)
            m_dp = gpulab.DataParallel(copy.deepcopy(m))
            opt, opt_dp = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(m_dp.parameters(), lr=0.1)
            tol = 1e-3 if torch.half in dtypes else 1e-5
            for _ in range(2):  # the first iteration creates grads, the second reuses zeroed ones
                F.mse_loss(m(inp).float(), target).backward()
                F.mse_loss(m_dp(inp).float(), target).backward()
                for k, (child, child_dp) in enumerate(zip(m.children(), m_dp.module.children(), strict=True)):
                    assert child.weight.grad.is_contiguous(memory_format=layouts[k])
                    assert child_dp.weight.grad.is_contiguous(memory_format=layouts[k]), (layouts, dtypes, k)
                    for p, p_dp in zip(child.parameters(), child_dp.parameters(), strict=True):
                        torch.testing.assert_close(p_dp.grad, p.grad, rtol=tol, atol=tol)
                opt.step()
                opt_dp.step()
                opt.zero_grad()
                opt_dp.zero_grad()


def test_parameter_list_and_dict_in_replicas():
    dev = use_virtual(2).primary
    p1, p2 = nn.Parameter(torch.rand(10, device=dev)), nn.Parameter(torch.rand(10, device=dev))

    class MyMod(nn.Module):
        def __init__(self, data, keys):
            super().__init__()
            self.data = data
            self.keys = keys

        def forward(self, inp):
            first, second = self.data[self.keys[0]], self.data[self.keys[1]]
            assert torch.equal(first, p1) and torch.equal(second, p2)
            assert first.requires_grad and second.requires_grad
            assert first.grad_fn is not None and second.grad_fn is not None
            return inp

    for container, keys in [(nn.ParameterList([p1, p2]), (0, 1)), (nn.ParameterDict({"0": p1, "1": p2}), ("0", "1"))]:
        gpulab.DataParallel(MyMod(container, keys))(torch.randn(8, 8, device=dev))


def test_no_reference_cycles():
    dev = use_virtual(2).primary

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(1, 1)

        def forward(self, x):
            return self.linear(x)

    model = gpulab.DataParallel(Model().to(dev))
    for batch in (1, 4):
        data = torch.randn(batch, 1, device=dev)
        gc.collect()
        model(data)
        assert gc.collect() == 0, f"reference cycles after a forward of {batch} sample(s)"


# --- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, -1, True, 2.0])
def test_devices_needs_a_whole_positive_number(n):
    with pytest.raises(ValueError, match="n must be a whole number of devices"):
        gpulab.devices(n, quiet=True)


def test_duplicate_device_ids_are_refused():
    use_virtual(2)
    with pytest.raises((ValueError, RuntimeError, AssertionError), match="device"):
        gpulab.DataParallel(nn.Linear(2, 2), device_ids=[0, 0])


@pytest.mark.parametrize("device_ids", [[0, 2], [5], [torch.device("cuda", 3)]])
def test_out_of_range_device_ids(device_ids):
    use_virtual(2)
    with pytest.raises(AssertionError, match="Invalid device id"):
        gpulab.DataParallel(nn.Linear(2, 2), device_ids=device_ids)


def test_negative_device_id_error_gives_a_usable_remedy():
    use_virtual(2)
    with pytest.raises(AssertionError, match="Invalid device id") as info:
        gpulab.DataParallel(nn.Linear(2, 2), device_ids=[-1])
    assert "gpulab.devices(0)" not in str(info.value)


def test_module_must_be_on_the_source_device():
    dev = use_virtual(2).primary
    inp = torch.randn(2, 2, device=dev)
    expected = re.escape(NOT_ON_SOURCE.format(dev, "meta"))
    bn_on_meta = nn.BatchNorm1d(2).to(dev)
    bn_on_meta.register_buffer("running_mean", torch.zeros(2, device="meta"))
    wrong = [
        nn.Linear(2, 2, device="meta"),
        nn.Sequential(nn.Linear(2, 2, device="meta")),
        nn.Sequential(nn.Linear(2, 2, device=dev), nn.Linear(2, 2, device="meta")),
        bn_on_meta,
    ]
    for module in wrong:
        for device_ids in (None, [0, 1], [1, 0]):
            dp = gpulab.DataParallel(module, device_ids)
            assert dp.src_device_obj == dev
            with pytest.raises(RuntimeError, match=expected):
                dp(inp)
    # Moving the wrapper moves the module: then it runs.
    dp = gpulab.DataParallel(nn.Sequential(nn.Linear(2, 2, device="meta"), nn.Linear(2, 2, device=dev)))
    dp.to_empty(device=dev)
    assert dp(inp).shape == (2, 2)


def test_single_device_moves_the_module_to_the_source_device():
    _install(2, "meta")
    dp = gpulab.DataParallel(nn.Linear(3, 2), device_ids=[0])
    assert dp.module.weight.device.type == "meta"


def test_scatter_moves_inputs_to_the_source_device():
    _install(2, "meta")
    dp = gpulab.DataParallel(nn.Linear(3, 2, device="meta"))
    inputs, kwargs = dp.scatter((torch.randn(4, 3),), {"y": torch.randn(4, 3)}, dp.device_ids)
    assert [chunk[0].device.type for chunk in inputs] == ["meta", "meta"]
    assert [kw["y"].device.type for kw in kwargs] == ["meta", "meta"]


# --- the private torch API gpulab depends on ---------------------------------------------------------------------

STAGE_CALLS = {
    "scatter": ["inputs", "kwargs", "self.device_ids"],
    "replicate": ["self.module", "self.device_ids[:len(inputs)]"],
    "parallel_apply": ["replicas", "inputs", "module_kwargs"],
    "gather": ["outputs", "self.output_device"],
}


def test_private_torch_api_still_there():
    hint = (
        f"torch {torch.__version__} changed what gpulab/data_parallel.py relies on "
        "(nn.Module._replicate_for_data_parallel, nn.DataParallel.forward's stages): update gpulab.DataParallel"
    )
    method = getattr(nn.Module, "_replicate_for_data_parallel", None)
    assert callable(method), f"nn.Module._replicate_for_data_parallel is gone; {hint}"
    assert list(inspect.signature(method).parameters) == ["self"], hint
    module = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    replica = module._replicate_for_data_parallel()
    assert type(replica) is type(module) and replica is not module, hint
    assert getattr(replica, "_is_replica", False) is True, f"replicas are no longer marked _is_replica; {hint}"
    assert dict(replica._parameters) == {} and list(replica.parameters(recurse=False)) == [], hint
    assert replica._modules == module._modules and replica._modules is not module._modules, hint
    assert replica[1]._buffers is module[1]._buffers, hint  # only the top level is copied; replicate() recurses
    child = module[1]._replicate_for_data_parallel()
    assert child._buffers == module[1]._buffers and child._buffers is not module[1]._buffers, hint

    # gpulab keeps nn.DataParallel.forward and overrides the four stages it calls, with these arguments.
    assert gdp.DataParallel.forward is nn.DataParallel.forward, "gpulab.DataParallel must not override forward"
    source = textwrap.dedent(inspect.getsource(nn.DataParallel.forward))
    calls = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STAGE_CALLS:
            if ast.unparse(node.func.value) == "self":
                calls[node.func.attr] = (node.lineno, [ast.unparse(arg) for arg in node.args])
    assert {stage: args for stage, (_, args) in calls.items()} == STAGE_CALLS, f"{hint}: forward calls {calls}"
    assert sorted(calls, key=lambda stage: calls[stage][0]) == list(STAGE_CALLS), f"{hint}: stage order changed"
    for attribute in ("self.src_device_obj", "self.device_ids", "self.module(", "module must have its parameters"):
        assert attribute in source, f"nn.DataParallel.forward no longer uses {attribute!r}; {hint}"
    for stage in STAGE_CALLS:
        assert stage in gdp.DataParallel.__dict__, f"gpulab.DataParallel must override {stage}"
        upstream = list(inspect.signature(getattr(nn.DataParallel, stage)).parameters)
        ours = list(inspect.signature(getattr(gdp.DataParallel, stage)).parameters)
        assert ours == upstream, f"nn.DataParallel.{stage}{upstream} changed; {hint}"

    # And, run for real, forward calls them in that order with those arguments.
    dev = use_virtual(3).primary
    log = []

    class Spy(gdp.DataParallel):
        def scatter(self, inputs, kwargs, device_ids):
            log.append(("scatter", list(device_ids)))
            return super().scatter(inputs, kwargs, device_ids)

        def replicate(self, module, device_ids):
            log.append(("replicate", list(device_ids)))
            return super().replicate(module, device_ids)

        def parallel_apply(self, replicas, inputs, kwargs):
            log.append(("parallel_apply", len(replicas)))
            return super().parallel_apply(replicas, inputs, kwargs)

        def gather(self, outputs, output_device):
            log.append(("gather", output_device))
            return super().gather(outputs, output_device)

    spy = Spy(nn.Linear(2, 2).to(dev), output_device=2)
    assert spy(torch.randn(2, 2, device=dev)).shape == (2, 2)
    assert log == [("scatter", [0, 1, 2]), ("replicate", [0, 1]), ("parallel_apply", 2), ("gather", 2)], hint


# --- training --------------------------------------------------------------------------------------------------


def test_training_five_sgd_steps_matches_one_device():
    dev = use_virtual(3).primary
    single = mlp().to(dev)
    wrapped = copy.deepcopy(single)
    dp = gpulab.DataParallel(wrapped)
    runs = [(single, torch.optim.SGD(single.parameters(), lr=0.1)), (dp, torch.optim.SGD(dp.parameters(), lr=0.1))]
    losses = {single: [], dp: []}
    torch.manual_seed(1)
    batches = [(torch.randn(10, 5, device=dev), torch.randn(10, 3, device=dev)) for _ in range(5)]
    for x, y in batches:
        for model, opt in runs:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses[model].append(loss.item())
    assert losses[dp] == pytest.approx(losses[single], abs=1e-5)
    assert len(set(losses[single])) == 5  # it did train
    for p, q in zip(single.parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=0)


# --- real GPUs -------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_gpu
def test_gpu_virtual_devices_on_cuda0_match_one_device():
    devs = use_virtual(2)
    assert devs.virtual and devs.primary == torch.device("cuda", 0)
    if torch.cuda.device_count() == 1:
        assert gpulab.current_devices() is devs  # gpulab.devices(2) chose virtual devices by itself
    torch.manual_seed(0)
    x, y = torch.randn(10, 5, device="cuda"), torch.randn(10, 3, device="cuda")
    reference = mlp().cuda()
    model = copy.deepcopy(reference)
    F.mse_loss(reference(x), y).backward()
    dp = gpulab.DataParallel(model)
    assert isinstance(dp, gdp.DataParallel) and dp.src_device_obj == torch.device("cuda", 0)
    out = dp(x)
    assert out.device == torch.device("cuda", 0)
    F.mse_loss(out, y).backward()
    assert_grads_close(reference, model, tol=1e-5)


@pytest.mark.gpu
@requires_gpu
def test_gpu_virtual_devices_accept_cpu_inputs_like_nn_data_parallel():
    use_virtual(2)
    model = nn.Linear(4, 3).cuda()
    x = torch.randn(6, 4, requires_grad=True)
    out = gpulab.DataParallel(model)(x)
    assert out.device == torch.device("cuda", 0)
    out.sum().backward()
    assert x.grad is not None and x.grad.device.type == "cpu"


@pytest.mark.gpu2
@requires_gpu2
def test_gpu2_real_gpus_give_nn_data_parallel_itself():
    devs = gpulab.devices(2, quiet=True)
    assert not devs.virtual
    dp = gpulab.DataParallel(nn.Linear(4, 3).cuda())
    assert type(dp) is nn.DataParallel
    assert dp.device_ids[:2] == [0, 1]


@pytest.mark.gpu2
@requires_gpu2
def test_gpu2_virtual_and_real_data_parallel_agree():
    torch.manual_seed(0)
    x, y = torch.randn(10, 5, device="cuda"), torch.randn(10, 3, device="cuda")
    model = mlp(batchnorm=True).cuda()
    twin = copy.deepcopy(model)
    real = nn.DataParallel(model, device_ids=[0, 1])
    real_out = real(x)
    F.mse_loss(real_out, y).backward()

    _install(2, "cuda:0")
    virtual_dp = gpulab.DataParallel(twin)
    assert isinstance(virtual_dp, gdp.DataParallel)
    virtual_out = virtual_dp(x)
    F.mse_loss(virtual_out, y).backward()

    torch.testing.assert_close(virtual_out, real_out, atol=1e-5, rtol=0)
    assert_grads_close(model, twin, tol=1e-5)
    for (name, a), b in zip(model.named_buffers(), twin.buffers(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=f"buffer {name}")


def test_a_replica_that_computes_with_a_tensor_of_another_device_fails_as_on_gpus():
    """On two GPUs, a forward that calls the caller's module (a closure, a list: not replicated) or another
    replica's copy (a dict the replicas share) meets tensors of cuda:0 in the replica on cuda:1 and fails with a
    device mismatch. Virtual devices raise the same error, found in the autograd graph (lesson 03's
    ``LossInForward`` is graded through it). Registered modules, kwargs, tiny batches on idle devices, a shared
    0-dim scalar (a CUDA operation takes a CPU scalar) and a custom Function's ``ctx`` compute as usual."""
    devices = use_virtual(3)
    model = nn.Linear(3, 2).to(devices.primary)

    class Closure(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.call = lambda x: model(x)

        def forward(self, x):
            return self.call(x)

    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.parts = [model]

        def forward(self, x):
            return {"out": (self.parts[0](x),)}

    class SharedDict(nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.cache = model, {}

        def forward(self, x):
            return self.cache.setdefault("model", self.model)(x)

    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.variable = 1  # not an AccumulateGrad node's tensor
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    temperature = torch.tensor(2.0, requires_grad=True)

    class Fine(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, shift=None):
            return Doubled.apply(self.model(x) + shift) / temperature

    inputs = torch.randn(6, 3, device=devices.primary)
    assert gpulab.DataParallel(model, device_ids=devices)(inputs).shape == (6, 2)
    shift = torch.randn(6, 2, device=devices.primary, requires_grad=True)
    assert gpulab.DataParallel(Fine(), device_ids=devices)(inputs, shift=shift).shape == (6, 2)
    assert gpulab.DataParallel(Fine(), device_ids=devices)(inputs[:2], shift=shift[:2]).shape == (2, 2)
    for wrong in (Closure(), Listed(), SharedDict()):
        with pytest.raises(RuntimeError, match="in replica [12] on device [12](.|\n)*the same device"):
            gpulab.DataParallel(wrong, device_ids=devices)(inputs)
    assert gpulab.DataParallel(Closure(), device_ids=devices)(inputs[:1]).shape == (1, 2)  # one chunk: replica 0
    with torch.no_grad():  # no graph, no trace: the limit of what virtual devices can see
        assert gpulab.DataParallel(Closure(), device_ids=devices)(inputs).shape == (6, 2)
