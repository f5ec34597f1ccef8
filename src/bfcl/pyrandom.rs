//! CPython's `random.Random` (MT19937) for the draws BFCL's classes make.
//!
//! Reproduces CPython 3.11 exactly for integer seeds: `seed(n)` runs `init_by_array` on the
//! 32-bit words of `|n|` (least significant first); `getrandbits(k)` fills 32-bit words
//! from the least significant, shifting the last one right by `32 - k`; `randint(a, b)` is
//! `a + _randbelow(b - a + 1)` with rejection sampling on `getrandbits(bit_length)`;
//! `random()` combines 27 and 26 bits into a 53-bit float; `uniform(a, b)` is
//! `a + (b - a) * random()`. Source: the BFCL trace README ("Randomness").

const N: usize = 624;
const M: usize = 397;

/// A CPython-compatible Mersenne Twister.
#[derive(Debug, Clone)]
pub struct PyRandom {
    mt: Box<[u32; N]>,
    index: usize,
}

impl PyRandom {
    /// `random.Random(seed)` for an integer seed.
    pub fn new(seed: i64) -> Self {
        let mut n = seed.unsigned_abs();
        let mut key = Vec::new();
        while n > 0 {
            key.push((n & 0xffff_ffff) as u32);
            n >>= 32;
        }
        if key.is_empty() {
            key.push(0);
        }
        let mut r = Self {
            mt: Box::new([0; N]),
            index: N,
        };
        r.init_by_array(&key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
        }
        self.mt[0] = 0x8000_0000;
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            for k in 0..N {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % N] & 0x7fff_ffff);
                let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.mt[k] = self.mt[(k + M) % N] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `getrandbits(k)` for `1 <= k <= 64`.
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        let k = k.clamp(1, 64);
        if k <= 32 {
            return u64::from(self.next_u32() >> (32 - k));
        }
        let low = u64::from(self.next_u32());
        let high = u64::from(self.next_u32() >> (64 - k));
        low | (high << 32)
    }

    /// `random()`: a float in [0, 1) with 53 random bits.
    pub fn random(&mut self) -> f64 {
        let a = f64::from(self.next_u32() >> 5);
        let b = f64::from(self.next_u32() >> 6);
        (a * 67_108_864.0 + b) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `randint(a, b)`, both ends included (`a <= b`; returns `a` otherwise).
    pub fn randint(&mut self, a: i64, b: i64) -> i64 {
        if b < a {
            return a;
        }
        let n = (b - a) as u64 + 1;
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return a + r as i64;
            }
        }
    }

    /// `uniform(a, b)`.
    pub fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_cpython_draws_from_the_bfcl_readme() {
        // MessageAPI's default seed: first message id 67410.
        assert_eq!(PyRandom::new(200_191).randint(10_000, 99_999), 67_410);
        // VehicleControlAPI's default seed: first get_current_speed.
        assert_eq!(
            PyRandom::new(141_053).uniform(0.0, 120.0),
            111.923_656_890_972_84
        );
    }

    #[test]
    fn matches_cpython_seed_zero_and_large_seeds() {
        // random.Random(0).random() == 0.8444218515250481
        assert_eq!(PyRandom::new(0).random(), 0.844_421_851_525_048_1);
        // random.Random(2**40 + 5): two key words; values printed by CPython 3.11.
        let mut r = PyRandom::new((1 << 40) + 5);
        assert_eq!(r.getrandbits(8), 129);
        assert_eq!(r.getrandbits(40), 294_277_936_956);
        assert_eq!(r.randint(1, 1_000_000_000_000), 579_938_387_081);
    }
}
