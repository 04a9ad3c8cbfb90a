//! `Tensor`: a cheap shared handle = layout + dtype + a shared storage block from the
//! device's allocator. Views share storage; `contiguous()` copies only when needed;
//! dropping the last handle returns the block.

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};

use crate::float8::{F8E4M3, F8E5M2};

use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Result, TensorError};
use crate::layout::{numel, Layout};
use crate::storage::Storage;

/// An n-dimensional array whose bytes come from headroom's allocator.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
    device: Device,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({:?}, {}", self.shape(), self.dtype)?;
        if self.device.is_meta() {
            write!(f, ", meta")?;
        }
        write!(f, ")")
    }
}

/// Reinterprets bytes as elements (allocator blocks are 512-byte aligned).
fn cast<T: Element>(bytes: &[u8]) -> &[T] {
    if bytes.is_empty() {
        // An empty block has a dangling byte pointer that need not be aligned for T.
        return &[];
    }
    let size = std::mem::size_of::<T>();
    assert!(
        (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
            && bytes.len().is_multiple_of(size)
    );
    // SAFETY: alignment and length checked above; every bit pattern is a valid value of
    // the element types (f32, bf16, f16, u8, i64).
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) }
}

fn cast_mut<T: Element>(bytes: &mut [u8]) -> &mut [T] {
    if bytes.is_empty() {
        return &mut [];
    }
    let size = std::mem::size_of::<T>();
    assert!(
        (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
            && bytes.len().is_multiple_of(size)
    );
    // SAFETY: as in `cast`; the exclusive borrow carries over.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / size) }
}

impl Tensor {
    /// A contiguous tensor with unspecified contents (every op's output starts here).
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Self> {
        let storage = Storage::allocate(device, numel(shape) * dtype.size())?;
        Ok(Self {
            storage: Arc::new(storage),
            layout: Layout::contiguous(shape),
            dtype,
            device: device.clone(),
        })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Self> {
        let mut t = Self::empty(shape, dtype, device)?;
        if let Some(l) = device.launcher() {
            l.zero(t.device_addr(), t.storage_bytes() as u64)?;
        } else if let Some(bytes) = t.bytes_mut() {
            bytes.fill(0);
        }
        Ok(t)
    }

    /// A tensor filled with `value` (rounded into `dtype`).
    pub fn full(shape: &[usize], value: f32, dtype: DType, device: &Device) -> Result<Self> {
        if device.launcher().is_some() {
            let host = Device::cpu()?;
            return Self::full(&[numel(shape)], value, dtype, &host)?
                .to_device(device)?
                .reshape(shape);
        }
        let mut t = Self::empty(shape, dtype, device)?;
        if !device.is_meta() {
            match dtype {
                DType::F32 => t.fill_typed::<f32>(value),
                DType::BF16 => t.fill_typed::<bf16>(value),
                DType::F16 => t.fill_typed::<f16>(value),
                DType::U8 => t.fill_typed::<u8>(value),
                DType::I64 => t.fill_typed::<i64>(value),
                DType::F8E4M3 => t.fill_typed::<F8E4M3>(value),
                DType::F8E5M2 => t.fill_typed::<F8E5M2>(value),
                DType::I8 => t.fill_typed::<i8>(value),
            }
        }
        Ok(t)
    }

    fn fill_typed<T: Element>(&mut self, value: f32) {
        if let Some(data) = self.data_mut::<T>() {
            data.fill(T::from_f32(value));
        }
    }

    /// A tensor holding a copy of `data` with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Self> {
        if data.len() != numel(shape) {
            return Err(TensorError::shape(
                "from_slice",
                format!(
                    "{} values do not fill shape {shape:?} ({} elements)",
                    data.len(),
                    numel(shape)
                ),
            ));
        }
        let mut t = Self::empty(shape, T::DTYPE, device)?;
        if let Some(l) = device.launcher() {
            // SAFETY: the element types are plain numbers without padding; the byte view
            // covers exactly `data`.
            let bytes = unsafe {
                std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
            };
            l.upload(t.device_addr(), bytes)?;
        } else if let Some(out) = t.data_mut::<T>() {
            out.copy_from_slice(data);
        }
        Ok(t)
    }

    /// A tensor of `dtype` from f32 values (rounded into the dtype).
    pub fn from_f32(data: &[f32], shape: &[usize], dtype: DType, device: &Device) -> Result<Self> {
        let t = Self::from_slice(data, shape, device)?;
        t.to_dtype(dtype)
    }

    /// A tensor from raw little-endian bytes of `dtype` (what files hold).
    pub fn from_bytes(
        bytes: &[u8],
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if bytes.len() != numel(shape) * dtype.size() {
            return Err(TensorError::shape(
                "from_bytes",
                format!(
                    "{} bytes do not fill shape {shape:?} of {dtype} ({} bytes)",
                    bytes.len(),
                    numel(shape) * dtype.size()
                ),
            ));
        }
        let mut t = Self::empty(shape, dtype, device)?;
        if let Some(l) = device.launcher() {
            l.upload(t.device_addr(), bytes)?;
        } else if let Some(out) = t.bytes_mut() {
            out.copy_from_slice(bytes);
        }
        Ok(t)
    }

    /// A tensor of `target` dtype from raw little-endian bytes of `stored` dtype, converted
    /// element by element straight into one allocator block (no intermediate copy).
    pub fn from_bytes_as(
        bytes: &[u8],
        shape: &[usize],
        stored: DType,
        target: DType,
        device: &Device,
    ) -> Result<Self> {
        if stored == target {
            return Self::from_bytes(bytes, shape, stored, device);
        }
        if bytes.len() != numel(shape) * stored.size() {
            return Err(TensorError::shape(
                "from_bytes_as",
                format!(
                    "{} bytes do not fill shape {shape:?} of {stored} ({} bytes)",
                    bytes.len(),
                    numel(shape) * stored.size()
                ),
            ));
        }
        // The element reader is chosen once per tensor, not per element.
        fn reader(dtype: DType) -> fn(&[u8]) -> f32 {
            match dtype {
                DType::F32 => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                DType::BF16 => |b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
                DType::F16 => |b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
                DType::U8 => |b| f32::from(b[0]),
                DType::I64 => {
                    |b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
                }
                DType::F8E4M3 => |b| F8E4M3(b[0]).to_f32(),
                DType::F8E5M2 => |b| F8E5M2(b[0]).to_f32(),
                DType::I8 => |b| f32::from(b[0] as i8),
            }
        }
        fn fill<T: Element>(t: &mut Tensor, bytes: &[u8], stored: DType) {
            let read = reader(stored);
            if let Some(out) = t.data_mut::<T>() {
                for (o, chunk) in out.iter_mut().zip(bytes.chunks_exact(stored.size())) {
                    *o = T::from_f32(read(chunk));
                }
            }
        }
        if device.launcher().is_some() {
            // Converted on the host, then one upload.
            let host = Device::cpu()?;
            return Self::from_bytes_as(bytes, shape, stored, target, &host)?.to_device(device);
        }
        let mut t = Self::empty(shape, target, device)?;
        match target {
            DType::F32 => fill::<f32>(&mut t, bytes, stored),
            DType::BF16 => fill::<bf16>(&mut t, bytes, stored),
            DType::F16 => fill::<f16>(&mut t, bytes, stored),
            DType::U8 => fill::<u8>(&mut t, bytes, stored),
            DType::I64 => fill::<i64>(&mut t, bytes, stored),
            DType::F8E4M3 => fill::<F8E4M3>(&mut t, bytes, stored),
            DType::F8E5M2 => fill::<F8E5M2>(&mut t, bytes, stored),
            DType::I8 => fill::<i8>(&mut t, bytes, stored),
        }
        Ok(t)
    }

    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.layout.shape().len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the bytes live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Shape, strides and offset.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Whether the elements are dense and row-major.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Bytes of the storage block behind this tensor (shared by its views).
    pub fn storage_bytes(&self) -> usize {
        self.storage.len()
    }

    /// Whether this is the only handle on its storage.
    pub(crate) fn owns_storage_alone(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
    }

    /// Whether two tensors are views of one storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Size of axis `axis`, or a shape error naming `op`.
    pub fn dim(&self, op: &'static str, axis: usize) -> Result<usize> {
        self.shape().get(axis).copied().ok_or_else(|| {
            TensorError::shape(
                op,
                format!("axis {axis} out of range for shape {:?}", self.shape()),
            )
        })
    }

    fn with_layout(&self, layout: Layout) -> Self {
        Self {
            storage: Arc::clone(&self.storage),
            layout,
            dtype: self.dtype,
            device: self.device.clone(),
        }
    }

    /// A view with the axes reordered.
    pub fn permute(&self, order: &[usize]) -> Result<Self> {
        Ok(self.with_layout(self.layout.permute(order)?))
    }

    /// A view with two axes swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        let mut order: Vec<usize> = (0..self.rank()).collect();
        if a >= order.len() || b >= order.len() {
            return Err(TensorError::shape(
                "transpose",
                format!("axes {a} and {b} out of range for shape {:?}", self.shape()),
            ));
        }
        order.swap(a, b);
        self.permute(&order)
    }

    /// A view of `len` entries of `axis` from `start`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        Ok(self.with_layout(self.layout.narrow(axis, start, len)?))
    }

    /// A view broadcast to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Self> {
        Ok(self.with_layout(self.layout.broadcast_to(shape)?))
    }

    /// The same elements with `shape`; a view when contiguous, else a copy first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        if numel(shape) != self.numel() {
            return Err(TensorError::shape(
                "reshape",
                format!(
                    "cannot reshape {:?} ({} elements) to {shape:?} ({} elements)",
                    self.shape(),
                    self.numel(),
                    numel(shape)
                ),
            ));
        }
        let source = self.contiguous()?;
        let layout = source.layout.reshape(shape).ok_or_else(|| {
            TensorError::shape("reshape", "internal: contiguous layout did not reshape")
        })?;
        Ok(source.with_layout(layout))
    }

    /// A view with a size-1 axis inserted at `axis`.
    pub fn unsqueeze(&self, axis: usize) -> Result<Self> {
        if axis > self.rank() {
            return Err(TensorError::shape(
                "unsqueeze",
                format!("axis {axis} out of range for shape {:?}", self.shape()),
            ));
        }
        let mut shape = self.shape().to_vec();
        let mut strides = self.layout.strides().to_vec();
        let stride = strides.get(axis).map_or(1, |&s| s * shape[axis]);
        shape.insert(axis, 1);
        strides.insert(axis, stride);
        Ok(self.with_layout(Layout::new(shape, strides, self.layout.offset())))
    }

    /// A view without size-1 axis `axis`.
    pub fn squeeze(&self, axis: usize) -> Result<Self> {
        if self.shape().get(axis) != Some(&1) {
            return Err(TensorError::shape(
                "squeeze",
                format!("axis {axis} of shape {:?} is not of size 1", self.shape()),
            ));
        }
        let mut shape = self.shape().to_vec();
        let mut strides = self.layout.strides().to_vec();
        shape.remove(axis);
        strides.remove(axis);
        Ok(self.with_layout(Layout::new(shape, strides, self.layout.offset())))
    }

    /// This tensor if it is contiguous, else a dense copy.
    pub fn contiguous(&self) -> Result<Self> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy_as(self.dtype)
    }

    /// The elements converted to `dtype` (this tensor itself when nothing changes).
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        self.copy_as(dtype)
    }

    /// A contiguous f32 version (itself when already so): the form kernels read.
    pub fn to_f32_contiguous(&self) -> Result<Self> {
        if self.dtype == DType::F32 && self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy_as(DType::F32)
    }

    /// Overwrites the leading `src.shape()[axis]` entries along `axis` with `src` (the
    /// other axes equal, every axis before `axis` of size 1, so they are one contiguous
    /// run at the start of the storage), leaving the rest as it is; the same ownership
    /// rules as [`Tensor::assign`]. A paged cache fills the used rows of a page this way.
    pub fn assign_leading(&mut self, axis: usize, src: &Tensor) -> Result<()> {
        let fits = src.rank() == self.rank()
            && axis < self.rank()
            && self.shape()[..axis].iter().all(|&n| n == 1)
            && (0..self.rank()).all(|a| {
                if a == axis {
                    src.shape()[a] <= self.shape()[a]
                } else {
                    src.shape()[a] == self.shape()[a]
                }
            });
        if !fits {
            return Err(TensorError::shape(
                "assign_leading",
                format!(
                    "source {:?} is not a leading part of {:?} along axis {axis}",
                    src.shape(),
                    self.shape()
                ),
            ));
        }
        if !self.is_contiguous() || self.layout.offset() != 0 {
            return Err(TensorError::shape(
                "assign_leading",
                "the destination must be a contiguous tensor that owns its storage alone",
            ));
        }
        // The leading run is itself a contiguous tensor at offset 0: assign into it.
        let whole = std::mem::replace(&mut self.layout, Layout::contiguous(src.shape()));
        let done = self.assign(src);
        self.layout = whole;
        done
    }

    /// The storage bytes, or `None` on a meta device.
    pub fn storage_data(&self) -> Option<&[u8]> {
        self.storage.bytes()
    }

    /// The storage as elements of `T` (all of it, views included); `None` on a meta
    /// device or when `T` is not this tensor's dtype.
    pub fn storage_as<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        self.storage.bytes().map(cast::<T>)
    }

    /// The elements of a contiguous tensor of dtype `T`, in order; `None` otherwise or on
    /// a meta device.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        if !self.is_contiguous() {
            return None;
        }
        let all = self.storage_as::<T>()?;
        let start = self.layout.offset();
        all.get(start..start + self.numel())
    }

    /// The bytes of a contiguous tensor's elements in host memory; `None` for a view
    /// with gaps, on a meta device or on a GPU (what a collective backend sends).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        if !self.is_contiguous() || self.device.launcher().is_some() {
            return None;
        }
        let size = self.dtype.size();
        let start = self.layout.offset() * size;
        self.storage
            .bytes()?
            .get(start..start + self.numel() * size)
    }

    /// The mutable bytes of a fresh contiguous host tensor that owns its storage alone
    /// (what a collective backend receives into); `None` otherwise.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        if !self.is_contiguous()
            || self.layout.offset() != 0
            || self.device.launcher().is_some()
            || Arc::strong_count(&self.storage) != 1
        {
            return None;
        }
        let n = self.numel() * self.dtype.size();
        Arc::get_mut(&mut self.storage)?.bytes_mut()?.get_mut(..n)
    }

    /// Mutable bytes of a tensor that owns its storage alone (fresh op outputs).
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        if self.device.is_meta() {
            return None;
        }
        let storage =
            Arc::get_mut(&mut self.storage).expect("writes go to fresh, unshared outputs");
        storage.bytes_mut()
    }

    /// Mutable elements of a fresh contiguous output of dtype `T`; `None` on a meta
    /// device (so callers skip the compute).
    pub fn data_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        assert_eq!(
            T::DTYPE,
            self.dtype,
            "typed write with the tensor's own dtype"
        );
        assert!(self.is_contiguous() && self.layout.offset() == 0);
        let n = self.numel();
        self.bytes_mut().map(|b| &mut cast_mut::<T>(b)[..n])
    }

    /// The elements as a `Vec<T>` in row-major order (T must be the tensor's dtype).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(TensorError::DType {
                op: "to_vec",
                expected: "the tensor's own dtype (use to_dtype first)",
                got: T::DTYPE,
            });
        }
        if self.device.launcher().is_some() {
            return self.to_device(&Device::cpu()?)?.to_vec::<T>();
        }
        let data = self
            .storage_as::<T>()
            .ok_or(TensorError::Meta { op: "to_vec" })?;
        let mut out = Vec::with_capacity(self.numel());
        self.layout.for_each_index(|_, idx| out.push(data[idx]));
        Ok(out)
    }

    /// The elements widened to f32 in row-major order.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let t = self.to_f32_contiguous()?;
        if self.device.launcher().is_some() {
            return t.to_vec::<f32>();
        }
        t.as_slice::<f32>()
            .map(<[f32]>::to_vec)
            .ok_or(TensorError::Meta { op: "to_f32_vec" })
    }

    /// This tensor on `device` (itself when already there, else a copy of its bytes).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if &self.device == device {
            return Ok(self.clone());
        }
        let dense = self.contiguous()?;
        if device.is_meta() {
            return Tensor::empty(self.shape(), self.dtype, device);
        }
        if let Some(l) = self.device.launcher() {
            let mut host = vec![0u8; self.numel() * self.dtype.size()];
            l.download(dense.device_addr(), &mut host)?;
            return Tensor::from_bytes(&host, self.shape(), self.dtype, device);
        }
        let bytes = dense
            .storage_data()
            .ok_or(TensorError::Meta { op: "to_device" })?;
        let start = dense.layout.offset() * self.dtype.size();
        Tensor::from_bytes(
            &bytes[start..start + self.numel() * self.dtype.size()],
            self.shape(),
            self.dtype,
            device,
        )
    }

    /// Device address of the first element (on a GPU device; fake on meta devices).
    pub fn device_addr(&self) -> u64 {
        self.storage.addr() + (self.layout.offset() * self.dtype.size()) as u64
    }

    /// Bytes from [`Self::device_addr`] to the end of the last element the view reaches.
    pub(crate) fn span_bytes(&self) -> u64 {
        if self.numel() == 0 {
            return 0;
        }
        let last: usize = self
            .shape()
            .iter()
            .zip(self.layout.strides())
            .map(|(&n, &s)| (n - 1) * s)
            .sum();
        ((last + 1) * self.dtype.size()) as u64
    }

    /// This tensor as a kernel argument the kernel reads.
    pub(crate) fn read_arg(&self) -> crate::cuda::launch::Arg {
        crate::cuda::launch::Arg::Ptr {
            addr: self.device_addr(),
            bytes: self.span_bytes(),
            access: crate::cuda::launch::Access::Read,
        }
    }

    /// This tensor as a kernel argument the kernel writes.
    pub(crate) fn write_arg(&self) -> crate::cuda::launch::Arg {
        crate::cuda::launch::Arg::Ptr {
            addr: self.device_addr(),
            bytes: self.span_bytes(),
            access: crate::cuda::launch::Access::Write,
        }
    }

    /// This tensor with its bytes in host memory (a copy from a GPU device, else itself).
    pub fn to_host(&self) -> Result<Tensor> {
        if self.device.launcher().is_some() {
            self.to_device(&Device::cpu()?)
        } else {
            Ok(self.clone())
        }
    }

    /// Checks that this tensor holds floats (f32, bf16, f16), naming `op` otherwise.
    pub fn require_float(&self, op: &'static str) -> Result<()> {
        if self.dtype.is_float() {
            Ok(())
        } else {
            Err(TensorError::DType {
                op,
                expected: "a float dtype (f32, bf16, f16)",
                got: self.dtype,
            })
        }
    }

    /// Checks that `other` lives on this tensor's device.
    pub fn same_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.device == other.device {
            Ok(())
        } else {
            Err(TensorError::Device { op })
        }
    }
}
