// Python binding of the native quantizer: tensor checks, output allocation, device guard and current stream.
//
// Only the light ATen/pybind headers are included (not torch/extension.h) to keep the cold JIT build short.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <ATen/EmptyTensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <climits>
#include <functional>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "quantizer.h"
#include "wire_formats.h"

namespace {

// Last-resort argument checks, throwing std::invalid_argument (ValueError) rather than TORCH_CHECK's c10::Error. With
// torch 2.11 and CUDA 13 a c10::Error thrown by an extension built like this one has crashed the interpreter, and so
// have this extension's std exceptions: the Python wrappers (backends/cuda.py) check first.
template <typename... Args>
void require(bool ok, const Args&... message)
{
    if (!ok) throw std::invalid_argument(c10::str(message...));
}

dszpp::Format format_of(at::ScalarType type, const char* what)
{
    switch (type) {
        case at::kHalf: return dszpp::Format::kHalf;
        case at::kBFloat16: return dszpp::Format::kBFloat16;
        case at::kFloat: return dszpp::Format::kFloat;
        default: throw std::invalid_argument(c10::str(what, " must be float16, bfloat16 or float32, got ", type));
    }
}

void check_flat_cuda(const at::Tensor& t, const char* what)
{
    require(t.is_cuda(), what, " must be a CUDA tensor");
    require(t.dim() == 1 && t.is_contiguous(), what, " must be flat and contiguous");
}

// The int8 entry points read any contiguous tensor as flat and give their results its shape.
void check_contiguous_cuda(const at::Tensor& t, const char* what)
{
    require(t.is_cuda(), what, " must be a CUDA tensor");
    require(t.is_contiguous(), what, " must be contiguous");
}

// The int8 outputs come straight from the CUDA caching allocator instead of through the operator dispatcher
// (at::empty) or at::detail::empty_cuda (which sets and restores the device around it): the same tensor for a
// fraction of a microsecond less, on a path ZeRO-3 takes for every gathered parameter or bucket. The allocator serves
// the current device, which OnDevice has made the input's.
at::Tensor empty_on(at::IntArrayRef sizes, at::ScalarType type)
{
    return at::Tensor(at::detail::empty_generic(
        sizes, c10::cuda::CUDACachingAllocator::get(), c10::DispatchKeySet(c10::DispatchKey::CUDA), type, std::nullopt));
}

// Makes the tensor's device current for the allocation and the launch. ZeRO-3 calls with tensors on the current
// device, so the guard (which restores the previous device afterwards) is only built when they differ.
class OnDevice {
public:
    explicit OnDevice(const at::Tensor& tensor) : index_(tensor.device().index())
    {
        if (c10::cuda::current_device() != index_) guard_.emplace(tensor.device());
    }
    cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(index_); }

private:
    c10::DeviceIndex index_;
    std::optional<c10::cuda::CUDAGuard> guard_;
};

at::ScalarType scalar_type_of(int64_t format_id)
{
    switch (format_id) {
        case 0: return at::kHalf;
        case 1: return at::kBFloat16;
        case 2: return at::kFloat;
        default:
            throw std::invalid_argument(c10::str("format id must be 0 (fp16), 1 (bf16) or 2 (fp32), got ", format_id));
    }
}

// Allocation and launch for inputs already checked, on the input's device and current stream.
std::tuple<at::Tensor, at::Tensor> run_quantize(const at::Tensor& input,
                                                dszpp::Format format,
                                                int64_t groups,
                                                int64_t group_size)
{
    const OnDevice device(input);
    at::Tensor codes = empty_on(input.sizes(), at::kChar);
    at::Tensor scales = empty_on({groups}, at::kFloat);
    dszpp::launch_quantize(format,
                           input.data_ptr(),
                           codes.data_ptr<int8_t>(),
                           scales.data_ptr<float>(),
                           groups,
                           group_size,
                           input.numel(),
                           device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {codes, scales};
}

at::Tensor run_dequantize(const at::Tensor& codes,
                          const at::Tensor& scales,
                          int64_t group_size,
                          int64_t block_numel,
                          at::ScalarType out_type)
{
    const OnDevice device(codes);
    at::Tensor out = empty_on(codes.sizes(), out_type);
    dszpp::launch_dequantize(format_of(out_type, "out"),
                             codes.data_ptr<int8_t>(),
                             scales.data_ptr<float>(),
                             out.data_ptr(),
                             codes.numel(),
                             group_size,
                             block_numel,
                             device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// `groups` groups of `group_size` elements, the last one ending at numel (it may be shorter).
std::tuple<at::Tensor, at::Tensor> quantize(const at::Tensor& input, int64_t groups, int64_t group_size)
{
    check_contiguous_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    const int64_t numel = input.numel();
    require(groups >= 1 && group_size >= 0, "groups must be >= 1 and group_size >= 0");
    require(groups <= INT32_MAX, "at most 2^31 - 1 groups are supported");
    require(group_size < INT32_MAX - 64, "groups of 2^31 or more elements are not supported");
    require(numel <= groups * group_size && (numel == 0 || (groups - 1) * group_size < numel),
            "groups of group_size elements must cover numel, the last one holding at least one element");
    return run_quantize(input, format, groups, group_size);
}

// Returns a new tensor of the codes' shape in the format `format_id` names (a small int: one pybind argument
// conversion cheaper than a dtype object). A block_numel that is a multiple of group_size means equal groups; any
// other: per-block layouts (quantizer.h). Scales may be [S] or [S, 1]: only their count matters.
at::Tensor dequantize(
    const at::Tensor& codes, const at::Tensor& scales, int64_t group_size, int64_t block_numel, int64_t format_id)
{
    check_contiguous_cuda(codes, "codes");
    check_contiguous_cuda(scales, "scales");
    require(codes.scalar_type() == at::kChar, "codes must be int8");
    require(scales.scalar_type() == at::kFloat, "scales must be float32");
    require(codes.device() == scales.device(), "codes and scales on different devices");
    require(group_size >= 1 && block_numel >= 1, "group_size and block_numel must be >= 1");
    if (block_numel % group_size == 0) {
        require(codes.numel() <= scales.numel() * group_size, "codes do not fit the given groups and group_size");
    } else {
        const int64_t block_groups = (block_numel + group_size - 1) / group_size;
        require(scales.numel() % block_groups == 0 && codes.numel() <= scales.numel() / block_groups * block_numel,
                "codes do not fit blocks of block_numel elements with their scales");
    }
    return run_dequantize(codes, scales, group_size, block_numel, scalar_type_of(format_id));
}

// quantize() writing into the caller's `codes` (int8, input's numel) and `scales` (fp32, `groups`): views of a
// packet buffer, so that codes and scales leave in one all-gather without a copy.
void quantize_into(
    const at::Tensor& input, int64_t groups, int64_t group_size, at::Tensor& codes, at::Tensor& scales)
{
    check_contiguous_cuda(input, "input");
    check_contiguous_cuda(codes, "codes");
    check_contiguous_cuda(scales, "scales");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    require(codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat, "codes int8, scales float32");
    require(codes.device() == input.device() && scales.device() == input.device(), "tensors on different devices");
    const int64_t numel = input.numel();
    require(groups >= 1 && groups <= INT32_MAX && group_size >= 0 && group_size < INT32_MAX - 64,
            "groups must be in [1, 2^31) and group_size in [0, 2^31 - 64)");
    require(numel <= groups * group_size && (numel == 0 || (groups - 1) * group_size < numel),
            "groups of group_size elements must cover numel, the last one holding at least one element");
    require(codes.numel() == numel && scales.numel() == groups, "codes must hold numel values and scales groups");
    const OnDevice device(input);
    dszpp::launch_quantize(format,
                           input.data_ptr(),
                           codes.data_ptr<int8_t>(),
                           scales.data_ptr<float>(),
                           groups,
                           group_size,
                           numel,
                           device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Per-rank rows read in place from a gathered buffer of packets: `codes` [k, n] int8 and `scales` [k, G] fp32,
// views with unit inner stride whose rows lie the same number of bytes apart. Returns a new [k, n] tensor.
at::Tensor dequantize_rows(const at::Tensor& codes, const at::Tensor& scales, int64_t group_size, int64_t format_id)
{
    require(codes.is_cuda() && codes.device() == scales.device(), "codes and scales must be on one CUDA device");
    require(codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat, "codes int8, scales float32");
    require(codes.dim() == 2 && scales.dim() == 2 && codes.size(0) == scales.size(0), "codes [k, n], scales [k, G]");
    require(codes.stride(1) == 1 && scales.stride(1) == 1, "rows must be contiguous");
    const int64_t rows = codes.size(0), numel = codes.size(1);
    require(rows <= 65535, "at most 65535 rows");
    require(rows == 1 || codes.stride(0) == scales.stride(0) * 4, "codes and scales rows must lie equally far apart");
    require(group_size >= 1 && scales.size(1) == (numel + group_size - 1) / group_size,
            "scales must hold one value per group of group_size in a row");
    const at::ScalarType out_type = scalar_type_of(format_id);
    const OnDevice device(codes);
    at::Tensor out = empty_on({rows, numel}, out_type);
    dszpp::launch_dequantize_rows(format_of(out_type, "out"),
                                  codes.data_ptr<int8_t>(),
                                  scales.data_ptr<float>(),
                                  rows == 1 ? 0 : codes.stride(0),
                                  out.data_ptr(),
                                  numel,
                                  rows * numel,
                                  group_size,
                                  device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// ---- Native call-signature tables: ops.quantize / ops.dequantize's hot path for CUDA tensors ----
//
// ops.py checks each new call signature in Python and remembers it. For this backend it also hands the signature to
// remember_quantize / remember_dequantize here, and its first step on every call is fast_quantize / fast_dequantize:
// plain CPython functions (METH_FASTCALL, no pybind argument matching) taking ops' own arguments. A signature is
// admitted only in the one form this file can read without Python (exact Tensor or Parameter, a CUDA tensor of an
// accepted dtype, contiguous, None or a plain int where ops allows an int, the backend "auto" or "cuda"); the key is
// then what ops' checks read beyond that form (element counts and the arguments), so a remembered key has passed
// them. Anything else, and any key not remembered, returns None: ops takes its own path, which raises where the
// input is wrong. Nothing here raises for bad input; only failures of the allocation or the launch propagate.

constexpr int64_t kNone = INT64_MIN;  // an argument given as None (ops accepts only ints >= 1 otherwise)

// None -> kNone, a plain int (not bool) >= 1 -> its value; false for anything else.
bool read_count(PyObject* arg, int64_t& value)
{
    if (arg == Py_None) {
        value = kNone;
        return true;
    }
    if (!PyLong_CheckExact(arg)) return false;
    int overflow = 0;
    value = PyLong_AsLongLongAndOverflow(arg, &overflow);
    return overflow == 0 && value >= 1;
}

// "auto" -> 0, "cuda" -> 1 (both serve CUDA tensors with this extension once it is loaded); -1 otherwise.
int read_backend(PyObject* arg)
{
    if (!PyUnicode_CheckExact(arg)) return -1;
    if (PyUnicode_CompareWithASCIIString(arg, "auto") == 0) return 0;
    if (PyUnicode_CompareWithASCIIString(arg, "cuda") == 0) return 1;
    return -1;
}

// None -> fp16 (dequantize's default), a torch dtype of the three formats -> itself; false for anything else.
bool read_out_type(PyObject* arg, at::ScalarType& type)
{
    if (arg == Py_None) {
        type = at::kHalf;
        return true;
    }
    if (!THPDtype_Check(arg)) return false;
    type = reinterpret_cast<THPDtype*>(arg)->scalar_type;
    return type == at::kHalf || type == at::kBFloat16 || type == at::kFloat;
}

// The tensor behind `arg` when it is an exact Tensor or Parameter on a CUDA device (and contiguous, where asked: the
// keys leave contiguity out, and ops makes a copy for the extension); else nullptr.
const at::Tensor* read_cuda_tensor(PyObject* arg, bool contiguous)
{
    if (!THPVariable_CheckExact(arg)) return nullptr;
    const at::Tensor& tensor = THPVariable_Unpack(arg);
    return tensor.is_cuda() && (!contiguous || tensor.is_contiguous()) ? &tensor : nullptr;
}

struct SignatureHash {
    template <typename Key>
    size_t operator()(const Key& key) const
    {
        size_t h = 0;
        for (const int64_t part : key) h = h * 0x9E3779B97F4A7C15ull + std::hash<int64_t>{}(part);
        return h;
    }
};

// quantize: numel, groups argument, backend -> (groups, group_size).
using QuantizeKey = std::array<int64_t, 3>;
std::unordered_map<QuantizeKey, std::pair<int64_t, int64_t>, SignatureHash> quantize_signatures;
// dequantize: codes numel, scales numel, output dtype, group_size and block_numel arguments, backend ->
// (group_size, block_numel) as the extension's dequantize takes them.
using DequantizeKey = std::array<int64_t, 6>;
std::unordered_map<DequantizeKey, std::pair<int64_t, int64_t>, SignatureHash> dequantize_signatures;

template <typename Table, typename Key>
void remember(Table& table, const Key& key, std::pair<int64_t, int64_t> value, int64_t limit)
{
    if (static_cast<int64_t>(table.size()) >= limit) table.clear();
    table[key] = value;
}

// The key of a quantize / dequantize call from ops' own arguments, read the same way when remembering and when
// looking up (`contiguous`: only the lookup asks; remembering leaves contiguity to ops). False where the arguments
// are not in the one form admitted (see above).
bool read_quantize_key(PyObject* x_arg, PyObject* groups_arg, PyObject* backend_arg, bool contiguous,
                       const at::Tensor*& x, QuantizeKey& key)
{
    x = read_cuda_tensor(x_arg, contiguous);
    int64_t groups_key = 0;
    const int backend = read_backend(backend_arg);
    if (x == nullptr || !read_count(groups_arg, groups_key) || backend < 0) return false;
    key = QuantizeKey{x->numel(), groups_key, backend};
    return true;
}

bool read_dequantize_key(PyObject* const* args, bool contiguous, const at::Tensor*& codes, const at::Tensor*& scales,
                         at::ScalarType& out_type, DequantizeKey& key)
{
    // args: codes, scales, dtype, group_size, block_numel, backend, as ops.dequantize takes them.
    codes = read_cuda_tensor(args[0], contiguous);
    scales = read_cuda_tensor(args[1], contiguous);
    int64_t size_key = 0, block_key = 0;
    const int backend = read_backend(args[5]);
    if (codes == nullptr || scales == nullptr || !read_out_type(args[2], out_type) || !read_count(args[3], size_key) ||
        !read_count(args[4], block_key) || backend < 0)
        return false;
    key = DequantizeKey{codes->numel(), scales->numel(), static_cast<int64_t>(out_type), size_key, block_key, backend};
    return true;
}

// Called by ops after its checks passed and this backend answered: the arguments as ops received them, the
// resolved layout, and ops' table limit. Returns whether the signature is admitted (see above).
bool remember_quantize(py::handle input, py::handle groups_arg, py::handle backend_arg, int64_t groups,
                       int64_t group_size, int64_t limit)
{
    const at::Tensor* x = nullptr;
    QuantizeKey key;
    if (!read_quantize_key(input.ptr(), groups_arg.ptr(), backend_arg.ptr(), false, x, key)) return false;
    remember(quantize_signatures, key, {groups, group_size}, limit);
    return true;
}

bool remember_dequantize(py::handle codes_arg, py::handle scales_arg, py::handle dtype_arg, py::handle group_size_arg,
                         py::handle block_numel_arg, py::handle backend_arg, int64_t group_size, int64_t block_numel,
                         int64_t limit)
{
    PyObject* const args[] = {codes_arg.ptr(),
                              scales_arg.ptr(),
                              dtype_arg.ptr(),
                              group_size_arg.ptr(),
                              block_numel_arg.ptr(),
                              backend_arg.ptr()};
    const at::Tensor *codes = nullptr, *scales = nullptr;
    at::ScalarType out_type;
    DequantizeKey key;
    if (!read_dequantize_key(args, false, codes, scales, out_type, key)) return false;
    remember(dequantize_signatures, key, {group_size, block_numel}, limit);
    return true;
}

void forget_signatures()
{
    quantize_signatures.clear();
    dequantize_signatures.clear();
}

// fast_quantize(x, groups, backend) -> (codes, scales), or None: see above.
PyObject* fast_quantize(PyObject*, PyObject* const* args, Py_ssize_t nargs)
{
    HANDLE_TH_ERRORS
    if (nargs != 3) Py_RETURN_NONE;
    const at::Tensor* x = nullptr;
    QuantizeKey key;
    if (!read_quantize_key(args[0], args[1], args[2], true, x, key)) Py_RETURN_NONE;
    const at::ScalarType type = x->scalar_type();
    if (type != at::kHalf && type != at::kBFloat16 && type != at::kFloat) Py_RETURN_NONE;
    const auto found = quantize_signatures.find(key);
    if (found == quantize_signatures.end()) Py_RETURN_NONE;
    auto [codes, scales] = run_quantize(*x, format_of(type, "input"), found->second.first, found->second.second);
    PyObject* result = PyTuple_New(2);
    if (result == nullptr) return nullptr;
    PyTuple_SET_ITEM(result, 0, THPVariable_Wrap(std::move(codes)));
    PyTuple_SET_ITEM(result, 1, THPVariable_Wrap(std::move(scales)));
    return result;
    END_HANDLE_TH_ERRORS
}

// fast_dequantize(codes, scales, dtype, group_size, block_numel, backend) -> values, or None: see above.
PyObject* fast_dequantize(PyObject*, PyObject* const* args, Py_ssize_t nargs)
{
    HANDLE_TH_ERRORS
    if (nargs != 6) Py_RETURN_NONE;
    const at::Tensor *codes = nullptr, *scales = nullptr;
    at::ScalarType out_type;
    DequantizeKey key;
    if (!read_dequantize_key(args, true, codes, scales, out_type, key)) Py_RETURN_NONE;
    const bool wire = codes->scalar_type() == at::kChar && scales->scalar_type() == at::kFloat &&
                      scales->device() == codes->device() &&
                      (scales->dim() == 1 || (scales->dim() == 2 && scales->size(1) == 1));
    if (!wire) Py_RETURN_NONE;
    const auto found = dequantize_signatures.find(key);
    if (found == dequantize_signatures.end()) Py_RETURN_NONE;
    return THPVariable_Wrap(run_dequantize(*codes, *scales, found->second.first, found->second.second, out_type));
    END_HANDLE_TH_ERRORS
}

PyMethodDef fast_quantize_def{
    "fast_quantize", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_quantize)), METH_FASTCALL,
    "ops.quantize's arguments (x, groups, backend) -> (codes, scales) for a remembered signature, else None"};
PyMethodDef fast_dequantize_def{
    "fast_dequantize", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_dequantize)), METH_FASTCALL,
    "ops.dequantize's arguments (codes, scales, dtype, group_size, block_numel, backend) -> values for a "
    "remembered signature, else None"};

using dszpp::int4::block_bytes;
using dszpp::int4::kGroup;

void check_qgz_geometry(int64_t rows, int64_t padded_chunk)
{
    require(rows >= 1 && rows <= INT32_MAX, "rows must be in [1, 2^31), got ", rows);
    require(padded_chunk >= 0 && padded_chunk % kGroup == 0,
                "padded_chunk must be a non-negative multiple of ", kGroup, ", got ", padded_chunk);
}

// Blocks arrive from an all-to-all: [sources, block bytes], contiguous, 4-byte aligned for the word accesses.
int check_qgz_blocks(const at::Tensor& blocks, int64_t rows, int64_t padded_chunk)
{
    require(blocks.is_cuda(), "blocks must be a CUDA tensor");
    require(blocks.scalar_type() == at::kByte, "blocks must be uint8, got ", blocks.scalar_type());
    require(blocks.dim() == 2 && blocks.is_contiguous(), "blocks must be 2-D [sources, bytes] and contiguous");
    require(blocks.size(1) == block_bytes(rows, padded_chunk),
                "blocks hold ", blocks.size(1), " bytes per source, expected ", block_bytes(rows, padded_chunk));
    require(blocks.size(0) >= 1 && blocks.size(0) <= INT32_MAX, "blocks need 1 to 2^31 - 1 sources");
    require(reinterpret_cast<uintptr_t>(blocks.data_ptr()) % 4 == 0, "blocks must be 4-byte aligned");
    return static_cast<int>(blocks.size(0));
}

at::Tensor qgz_encode(const at::Tensor& input, int64_t destinations, int64_t rows, int64_t chunk, int64_t padded_chunk)
{
    check_flat_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    check_qgz_geometry(rows, padded_chunk);
    require(destinations >= 1 && destinations <= INT32_MAX, "destinations must be in [1, 2^31)");
    require(chunk >= 0 && chunk <= padded_chunk, "chunk must be in [0, padded_chunk]");
    require(destinations * rows * chunk >= input.numel(), "destinations * rows chunks do not cover the input");
    const c10::cuda::CUDAGuard device_guard(input.device());
    at::Tensor out = at::empty({destinations, block_bytes(rows, padded_chunk)}, input.options().dtype(at::kByte));
    dszpp::launch_qgz_encode(format,
                             input.data_ptr(),
                             input.numel(),
                             chunk,
                             padded_chunk,
                             static_cast<int>(destinations),
                             static_cast<int>(rows),
                             out.data_ptr<uint8_t>(),
                             c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

at::Tensor qgz_reduce_encode(const at::Tensor& blocks, int64_t rows, int64_t padded_chunk)
{
    check_qgz_geometry(rows, padded_chunk);
    const int sources = check_qgz_blocks(blocks, rows, padded_chunk);
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    at::Tensor out = at::empty({rows, block_bytes(1, padded_chunk)}, blocks.options());
    dszpp::launch_qgz_reduce_encode(blocks.data_ptr<uint8_t>(),
                                    sources,
                                    static_cast<int>(rows),
                                    padded_chunk,
                                    out.data_ptr<uint8_t>(),
                                    c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// LoCo's fp32 error buffer: flat, contiguous, on the same device, one value per encoded value, 16-byte aligned.
void check_qgz_error(const at::Tensor& error, const at::Device& device, int64_t values)
{
    check_flat_cuda(error, "error");
    require(error.scalar_type() == at::kFloat, "error must be float32, got ", error.scalar_type());
    require(error.device() == device, "error and the input on different devices");
    require(error.numel() == values, "error holds ", error.numel(), " values, expected ", values);
    require(reinterpret_cast<uintptr_t>(error.data_ptr()) % 16 == 0, "error must be 16-byte aligned");
}

at::Tensor qgz_encode_feedback(const at::Tensor& input,
                               at::Tensor& error,
                               double beta,
                               double keep,
                               int64_t destinations,
                               int64_t rows,
                               int64_t chunk,
                               int64_t padded_chunk)
{
    check_flat_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    check_qgz_geometry(rows, padded_chunk);
    require(destinations >= 1 && destinations <= INT32_MAX, "destinations must be in [1, 2^31)");
    require(chunk >= 0 && chunk <= padded_chunk, "chunk must be in [0, padded_chunk]");
    require(destinations * rows * chunk >= input.numel(), "destinations * rows chunks do not cover the input");
    check_qgz_error(error, input.device(), destinations * rows * padded_chunk);
    const c10::cuda::CUDAGuard device_guard(input.device());
    at::Tensor out = at::empty({destinations, block_bytes(rows, padded_chunk)}, input.options().dtype(at::kByte));
    dszpp::launch_qgz_encode_feedback(format,
                                      input.data_ptr(),
                                      input.numel(),
                                      chunk,
                                      padded_chunk,
                                      static_cast<int>(destinations),
                                      static_cast<int>(rows),
                                      error.data_ptr<float>(),
                                      static_cast<float>(beta),
                                      static_cast<float>(keep),
                                      out.data_ptr<uint8_t>(),
                                      c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

at::Tensor qgz_reduce_encode_feedback(const at::Tensor& blocks,
                                      at::Tensor& error,
                                      double beta,
                                      double keep,
                                      int64_t rows,
                                      int64_t padded_chunk)
{
    check_qgz_geometry(rows, padded_chunk);
    const int sources = check_qgz_blocks(blocks, rows, padded_chunk);
    check_qgz_error(error, blocks.device(), rows * padded_chunk);
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    at::Tensor out = at::empty({rows, block_bytes(1, padded_chunk)}, blocks.options());
    dszpp::launch_qgz_reduce_encode_feedback(blocks.data_ptr<uint8_t>(),
                                             sources,
                                             static_cast<int>(rows),
                                             padded_chunk,
                                             error.data_ptr<float>(),
                                             static_cast<float>(beta),
                                             static_cast<float>(keep),
                                             out.data_ptr<uint8_t>(),
                                             c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// Writes into `out` (allocated by the caller in the gradient's dtype, numel <= padded_chunk).
void qgz_decode_sum(const at::Tensor& blocks, int64_t padded_chunk, double factor, at::Tensor& out)
{
    check_qgz_geometry(1, padded_chunk);
    const int sources = check_qgz_blocks(blocks, 1, padded_chunk);
    check_flat_cuda(out, "out");
    require(out.device() == blocks.device(), "out and blocks on different devices");
    require(out.numel() <= padded_chunk, "out has more elements than a chunk");
    const dszpp::Format format = format_of(out.scalar_type(), "out");
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    dszpp::launch_qgz_decode_sum(format,
                                 blocks.data_ptr<uint8_t>(),
                                 sources,
                                 padded_chunk,
                                 static_cast<float>(factor),
                                 out.data_ptr(),
                                 out.numel(),
                                 c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "deepspeed_zeropp native quantizers (fp16, bf16, fp32): int8 weights, qgZ 4-bit gradients";
    m.def("quantize", &quantize, "input, groups, group_size -> (int8 codes of input's shape, fp32 scales [groups])");
    m.def("dequantize",
          &dequantize,
          "codes, scales, group_size, block_numel, format id (0 fp16, 1 bf16, 2 fp32) -> codes[i] * scale of i");
    m.def("quantize_into", &quantize_into, "input, groups, group_size, codes, scales: quantize into given views");
    m.def("dequantize_rows",
          &dequantize_rows,
          "codes [k, n], scales [k, G] (rows apart), group_size, format id -> [k, n] values");
    m.def("qgz_encode", &qgz_encode, "qgZ: gradient, destinations, rows, chunk, padded_chunk -> uint8 blocks");
    m.def("qgz_reduce_encode", &qgz_reduce_encode, "qgZ: blocks, rows, padded_chunk -> summed, re-encoded blocks");
    m.def("qgz_encode_feedback",
          &qgz_encode_feedback,
          "LoCo: gradient, error, beta, 1 - beta, destinations, rows, chunk, padded_chunk -> blocks; error updated");
    m.def("qgz_reduce_encode_feedback",
          &qgz_reduce_encode_feedback,
          "LoCo: blocks, error, beta, 1 - beta, rows, padded_chunk -> re-encoded blocks; error updated");
    m.def("qgz_decode_sum", &qgz_decode_sum, "qgZ: blocks, padded_chunk, factor, out: out = sum * factor");
    m.def("remember_quantize",
          &remember_quantize,
          "ops.quantize's x, groups, backend after its checks passed; groups, group_size, table limit -> admitted");
    m.def("remember_dequantize",
          &remember_dequantize,
          "ops.dequantize's codes, scales, dtype, group_size, block_numel, backend after its checks passed; the "
          "extension's group_size, block_numel; table limit -> admitted");
    m.def("forget_signatures", &forget_signatures, "empty both signature tables");
    m.attr("fast_quantize") = py::reinterpret_steal<py::object>(PyCFunction_New(&fast_quantize_def, nullptr));
    m.attr("fast_dequantize") = py::reinterpret_steal<py::object>(PyCFunction_New(&fast_dequantize_def, nullptr));
}
