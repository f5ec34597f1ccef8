use envace::kernels::{kv_cache::KvCache, load, ModelSource};
use std::time::Instant;
use tch::{Device, Kind, Tensor};
fn main() {
    let _g = tch::no_grad_guard();
    let l = load(&ModelSource::Embedded, Device::Cpu, Kind::Float).unwrap();
    let m = &l.model;
    let b = 8i64;
    let mut cache = KvCache::new(m.config(), b as usize, 256, Device::Cpu, Kind::Float);
    let ids = Tensor::full([b], 100, (Kind::Int64, Device::Cpu));
    for round in 0..2 {
        let s = Instant::now();
        for p in 128..255 {
            let pos = Tensor::full([b], p, (Kind::Int64, Device::Cpu));
            let _ = m.decode(&ids, &pos, &mut cache);
        }
        println!(
            "varying: {:.1} ms/step",
            s.elapsed().as_secs_f64() * 1000.0 / 127.0
        );
        let s = Instant::now();
        for _ in 128..255 {
            let pos = Tensor::full([b], 190, (Kind::Int64, Device::Cpu));
            let _ = m.decode(&ids, &pos, &mut cache);
        }
        println!(
            "fixed 190: {:.1} ms/step (round {round})",
            s.elapsed().as_secs_f64() * 1000.0 / 127.0
        );
    }
}
