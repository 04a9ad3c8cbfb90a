//! Reading and writing tensors: safetensors (memory-mapped, copied into allocator blocks
//! once, dtype converted on load) and NumPy `.npy` files (for reference checks and tools).

pub mod npy;
pub mod safetensors;
