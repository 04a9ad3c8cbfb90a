//! The paged KV cache: visibility (sink + rolling window), pool accounting, and
//! generation through it equal to the masked full forward.

use headroom_model::dit::{DitConfig, KeyValues, WanTransformer};
use headroom_model::kv::{KvPool, PageLayout, SessionKv};
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Device, Tensor};

fn layout() -> PageLayout {
    PageLayout {
        layers: 2,
        tokens: 4,
        heads: 1,
        head_dim: 2,
        dtype: DType::BF16,
    }
}

fn block_kv(dev: &Device, frames: usize, value: f32) -> Vec<KeyValues> {
    (0..2)
        .map(|_| KeyValues {
            k: Tensor::full(&[1, frames * 4, 1, 2], value, DType::F32, dev).unwrap(),
            v: Tensor::full(&[1, frames * 4, 1, 2], -value, DType::F32, dev).unwrap(),
        })
        .collect()
}

#[test]
fn blocks_see_the_sink_plus_the_newest_history_as_stepwise_specifies() {
    let dev = Device::cpu().unwrap();
    let pool = KvPool::with_budget(layout(), 18 * layout().bytes(), 18, &dev).unwrap();
    let mut kv = SessionKv::new(&pool, 4, 9, 18, 3).unwrap();
    let mut seen = Vec::new();
    for n in 0..8 {
        seen.push(kv.history());
        kv.commit(3 * n, &block_kv(&dev, 3, n as f32)).unwrap();
    }
    let range = |a: usize, b: usize| (a..b).collect::<Vec<_>>();
    assert_eq!(seen[0], range(0, 0));
    assert_eq!(seen[1], range(0, 3));
    assert_eq!(seen[5], range(0, 15));
    assert_eq!(seen[6], [range(0, 9), range(12, 18)].concat());
    assert_eq!(seen[7], [range(0, 9), range(15, 21)].concat());
    // Values come back in frame order, through bf16 pages.
    let gathered = kv.gather().unwrap().unwrap();
    let k = gathered[1].k.to_vec::<f32>().unwrap();
    assert_eq!(k.len(), 15 * 4 * 2);
    assert_eq!(k[0], 0.0);
    assert_eq!(*k.last().unwrap(), 7.0);
    assert_eq!(
        gathered[0].v.to_vec::<f32>().unwrap()[9 * 8],
        -6.0,
        "frame 18 belongs to block 6"
    );
}

#[test]
fn the_pool_is_sized_once_refuses_what_does_not_fit_and_gets_every_page_back() {
    let dev = Device::cpu().unwrap();
    let allocated = || dev.platform().memory_stats().allocated_bytes.all().current;
    let pool = KvPool::with_budget(layout(), 40 * layout().bytes(), 18, &dev).unwrap();
    assert_eq!(pool.total_pages(), 40);
    let after_pool = allocated();
    let a = SessionKv::new(&pool, 4, 9, 18, 3).unwrap();
    let mut b = SessionKv::new(&pool, 4, 9, 18, 3).unwrap();
    assert_eq!(pool.free_pages(), 4);
    let err = SessionKv::new(&pool, 4, 9, 18, 3).unwrap_err().to_string();
    assert!(err.contains("18 pages needed, 4 of 40 free"), "{err}");
    for n in 0..9 {
        b.commit(3 * n, &block_kv(&dev, 3, 1.0)).unwrap();
    }
    drop(a);
    drop(b);
    assert_eq!(pool.free_pages(), 40);
    // Commits write into pooled pages: nothing new stays allocated.
    assert_eq!(allocated(), after_pool);
    let err = KvPool::with_budget(layout(), 10 * layout().bytes(), 18, &dev)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("holds 10 pages") && err.contains("at least 18"),
        "{err}"
    );
    assert!(
        SessionKv::new(&pool, 4, 9, 10, 3).is_err(),
        "window must hold the sink plus whole blocks"
    );
}

#[test]
fn generation_through_the_paged_cache_equals_the_masked_full_forward() {
    let dev = Device::cpu().unwrap();
    let config = DitConfig {
        num_attention_heads: 3,
        attention_head_dim: 12,
        text_dim: 20,
        freq_dim: 32,
        ffn_dim: 72,
        num_layers: 2,
        ..DitConfig::default()
    };
    let model = WanTransformer::seeded(config, 5, &dev, DType::F32).unwrap();
    let x = Tensor::randn(&[1, 16, 9, 4, 4], 1, 0, DType::F32, &dev).unwrap();
    let t = 500.0;
    let full = model
        .forward(&x, t, None, Some(3))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    // Pages of a whole frame, and pages of 3 tokens (a frame of 4 takes two, the second
    // holding one token): the same numbers either way.
    for page_tokens in [4, 3] {
        let layout = PageLayout {
            layers: 2,
            tokens: page_tokens,
            heads: 3,
            head_dim: 12,
            dtype: DType::F32,
        };
        let pages = 9 * layout.pages_per_frame(4);
        let pool = KvPool::with_budget(layout, pages as u64 * layout.bytes(), pages, &dev).unwrap();
        let mut kv = SessionKv::new(&pool, 4, 3, 9, 3).unwrap();
        let text = model.text_key_values(None).unwrap();
        let mut outs = Vec::new();
        for n in 0..3 {
            let chunk = x.narrow(2, 3 * n, 3).unwrap();
            let grid = model.grid(&chunk).unwrap();
            let past = kv.gather().unwrap();
            let (v, own) = model
                .forward_tokens(
                    &model.embed(&chunk).unwrap(),
                    &grid.positions(3 * n),
                    t,
                    &text,
                    past.as_deref(),
                    Mask::None,
                    None,
                )
                .unwrap();
            kv.commit(3 * n, &own).unwrap();
            outs.push(model.unpatchify(&v, grid).unwrap());
        }
        let paged = Tensor::cat(&outs.iter().collect::<Vec<_>>(), 2)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let err = full
            .iter()
            .zip(&paged)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err <= 1e-5, "{page_tokens} tokens per page: {err}");
    }
}

#[test]
fn sessions_of_two_resolutions_share_one_pool_of_token_pages() {
    let dev = Device::cpu().unwrap();
    // Pages of 3 tokens: frames of 4 tokens take 2 pages, frames of 9 take 3.
    let layout = PageLayout {
        tokens: 3,
        dtype: DType::F32,
        ..layout()
    };
    let pool = KvPool::with_budget(layout, 90 * layout.bytes(), 18, &dev).unwrap();
    assert_eq!(pool.layout().session_pages(4, 18), 36);
    assert_eq!(pool.layout().session_pages(9, 18), 54);
    let mut small = SessionKv::new(&pool, 4, 9, 18, 3).unwrap();
    let mut large = SessionKv::new(&pool, 9, 9, 18, 3).unwrap();
    assert_eq!(pool.free_pages(), 0);
    let err = SessionKv::new(&pool, 4, 9, 18, 3).unwrap_err().to_string();
    assert!(err.contains("36 pages needed, 0 of 90 free"), "{err}");
    let block = |tokens: usize, n: usize| -> Vec<KeyValues> {
        (0..2)
            .map(|l| {
                let values: Vec<f32> = (0..3 * tokens * 2)
                    .map(|i| (1000 * n + 100 * l + i) as f32)
                    .collect();
                let negated: Vec<f32> = values.iter().map(|x| -x).collect();
                let shape = [1, 3 * tokens, 1, 2];
                KeyValues {
                    k: Tensor::from_f32(&values, &shape, DType::F32, &dev).unwrap(),
                    v: Tensor::from_f32(&negated, &shape, DType::F32, &dev).unwrap(),
                }
            })
            .collect()
    };
    for n in 0..7 {
        small.commit(3 * n, &block(4, n)).unwrap();
        large.commit(3 * n, &block(9, n)).unwrap();
    }
    // Both histories come back exactly, frame after frame, through partly filled pages.
    for (kv, tokens) in [(&small, 4usize), (&large, 9)] {
        let history = kv.history();
        let gathered = kv.gather().unwrap().unwrap();
        let k = gathered[1].k.to_vec::<f32>().unwrap();
        let v = gathered[1].v.to_vec::<f32>().unwrap();
        assert_eq!(k.len(), history.len() * tokens * 2);
        let expected: Vec<f32> = history
            .iter()
            .flat_map(|&f| {
                let (n, j) = (f / 3, f % 3);
                (0..tokens * 2).map(move |i| (1000 * n + 100 + j * tokens * 2 + i) as f32)
            })
            .collect();
        assert_eq!(k, expected, "{tokens} tokens per frame");
        assert!(v.iter().zip(&expected).all(|(a, b)| *a == -b));
    }
    drop(small);
    drop(large);
    assert_eq!(pool.free_pages(), 90);
}
