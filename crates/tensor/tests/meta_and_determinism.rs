//! Meta execution allocates exactly like real execution; results do not depend on memory
//! state.

mod common;

use common::Rng;
use headroom_mem::TraceAction;
use headroom_tensor::{DType, Device, Tensor};

/// A small network-like chain of ops; returns the final tensor.
fn chain(dev: &Device, seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let x = Tensor::from_slice(&rng.vec(4 * 64, 1.0), &[4, 64], dev).unwrap();
    let w = Tensor::from_slice(&rng.vec(128 * 64, 0.1), &[128, 64], dev)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let b = Tensor::from_slice(&rng.vec(128, 0.1), &[128], dev).unwrap();
    let g = Tensor::full(&[128], 1.0, DType::F32, dev).unwrap();
    let h = x.linear(&w, Some(&b)).unwrap();
    let h = h
        .layer_norm(Some(&g), None, 1e-6)
        .unwrap()
        .gelu_tanh()
        .unwrap();
    let noise = Tensor::randn(&[4, 128], seed, 0, DType::F32, dev).unwrap();
    let h = h.add(&noise.mul_scalar(0.1).unwrap()).unwrap();
    let s = h
        .matmul(&h.transpose(0, 1).unwrap())
        .unwrap()
        .softmax()
        .unwrap();
    let y = s.matmul(&h).unwrap().rms_norm(None, 1e-6).unwrap();
    y.sum(1, true).unwrap().add(&y).unwrap().silu().unwrap()
}

#[test]
fn meta_execution_allocates_the_same_sizes_in_the_same_order_and_computes_nothing() {
    let cpu = Device::cpu().unwrap();
    let sim = Device::sim(1 << 34).unwrap();
    for dev in [&cpu, &sim] {
        dev.platform().allocator().set_history(100_000);
    }
    let real = chain(&cpu, 3);
    let meta = chain(&sim, 3);
    assert_eq!(real.shape(), meta.shape());
    assert!(sim.is_meta() && !cpu.is_meta());
    assert!(meta.to_f32_vec().is_err());
    let events = |dev: &Device| -> Vec<(TraceAction, u64)> {
        dev.platform()
            .allocator()
            .trace()
            .iter()
            .map(|e| (e.action, e.size))
            .collect()
    };
    let (a, b) = (events(&cpu), events(&sim));
    let allocs = a.iter().filter(|e| e.0 == TraceAction::Alloc).count();
    assert!(allocs > 15, "{allocs} allocations");
    assert_eq!(a, b);
    let (sa, sb) = (cpu.platform().memory_stats(), sim.platform().memory_stats());
    assert_eq!(sa.allocated_bytes.all().peak, sb.allocated_bytes.all().peak);
    assert_eq!(sa.reserved_bytes.all().peak, sb.reserved_bytes.all().peak);
}

#[test]
fn results_are_byte_identical_whatever_the_memory_state() {
    let dev = Device::cpu().unwrap();
    let first = chain(&dev, 11).to_vec::<f32>().unwrap();
    // Change the memory state: hold some blocks, flush the cache, fragment it.
    let hold: Vec<Tensor> = (1..20)
        .map(|i| Tensor::zeros(&[i * 1000], DType::F32, &dev).unwrap())
        .collect();
    dev.platform().empty_cache();
    let second = chain(&dev, 11).to_vec::<f32>().unwrap();
    drop(hold);
    dev.platform().empty_cache();
    let third = chain(&dev, 11).to_vec::<f32>().unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&first), bits(&second));
    assert_eq!(bits(&first), bits(&third));
    assert_ne!(
        bits(&first),
        bits(&chain(&dev, 12).to_vec::<f32>().unwrap())
    );
}

#[test]
fn dropping_the_last_handle_returns_the_block() {
    let dev = Device::cpu().unwrap();
    let allocated = || dev.platform().memory_stats().allocated_bytes.all().current;
    let base = allocated();
    let t = Tensor::zeros(&[1024, 1024], DType::F32, &dev).unwrap();
    let view = t.narrow(0, 0, 10).unwrap();
    assert_eq!(allocated() - base, 4 << 20);
    drop(t);
    assert_eq!(
        allocated() - base,
        4 << 20,
        "the view keeps the storage alive"
    );
    drop(view);
    assert_eq!(allocated(), base);
}

#[test]
fn empty_tensors_of_every_dtype_read_and_write() {
    let dev = Device::cpu().unwrap();
    let e = Tensor::zeros(&[0, 3], DType::F32, &dev).unwrap();
    assert_eq!(e.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    assert_eq!(e.add_scalar(1.0).unwrap().numel(), 0);
    let i = Tensor::zeros(&[0], DType::I64, &dev).unwrap();
    assert!(i.to_vec::<i64>().unwrap().is_empty());
}

#[test]
fn assign_overwrites_an_owned_block_in_place_and_refuses_shared_ones() {
    let dev = Device::cpu().unwrap();
    let mut page = Tensor::zeros(&[2, 3], DType::BF16, &dev).unwrap();
    let addr_before = page.storage_data().unwrap().as_ptr();
    let src = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &dev).unwrap();
    page.assign(&src).unwrap();
    assert_eq!(page.storage_data().unwrap().as_ptr(), addr_before);
    assert_eq!(
        page.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    let view = page.narrow(0, 0, 1).unwrap();
    assert!(page
        .assign(&src)
        .unwrap_err()
        .to_string()
        .contains("owns its storage"));
    drop(view);
    assert!(page.assign(&src.narrow(0, 0, 1).unwrap()).is_err());
}

#[test]
fn assign_leading_fills_the_first_rows_in_place_and_keeps_the_rest() {
    let dev = Device::cpu().unwrap();
    let mut page = Tensor::full(&[1, 3, 2], 9.0, DType::BF16, &dev).unwrap();
    let addr_before = page.storage_data().unwrap().as_ptr();
    let src = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 2, 2], &dev).unwrap();
    page.assign_leading(1, &src).unwrap();
    assert_eq!(page.storage_data().unwrap().as_ptr(), addr_before);
    assert_eq!(page.shape(), [1, 3, 2]);
    assert_eq!(
        page.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        [1.0, 2.0, 3.0, 4.0, 9.0, 9.0]
    );
    // Not a leading part: longer, another width, or rows behind a first axis of 2.
    let long = Tensor::zeros(&[1, 4, 2], DType::F32, &dev).unwrap();
    assert!(page.assign_leading(1, &long).is_err());
    let wide = Tensor::zeros(&[1, 2, 3], DType::F32, &dev).unwrap();
    assert!(page.assign_leading(1, &wide).is_err());
    let mut two = Tensor::zeros(&[2, 3, 2], DType::F32, &dev).unwrap();
    let rows = Tensor::zeros(&[2, 1, 2], DType::F32, &dev).unwrap();
    assert!(two.assign_leading(1, &rows).is_err());
    let view = page.narrow(1, 0, 1).unwrap();
    assert!(page.assign_leading(1, &src).is_err(), "a shared page");
    drop(view);
}
