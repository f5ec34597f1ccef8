use tch::{Device, Kind, Tensor};
fn main() {
    let x = Tensor::randn([2, 576], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
    let w = Tensor::ones([576], (Kind::BFloat16, Device::Cpu));
    println!(
        "rms_norm bf16 -> {:?}",
        x.rms_norm([576], Some(&w), 1e-5).kind()
    );
    let c = Tensor::ones([2, 576], (Kind::BFloat16, Device::Cpu));
    println!("mul -> {:?}", (&x * &c).kind());
    let t = Tensor::from(100000f32).pow(&Tensor::ones([3], (Kind::Float, Device::Cpu)));
    println!("pow -> {:?}", t.kind());
    println!("x / scalar f64 -> {:?}", (&x / 2.0).kind());
}
