//! The Fibonacci computation behind `POST /api/compute`.

/// F(n) by the naive doubly recursive definition, F(0) = 0 and F(1) = 1.
///
/// The exponential cost is the point: the endpoint exists to produce CPU-bound work of a
/// predictable size. Do not memoise.
pub fn naive(n: u32) -> u64 {
    if n < 2 {
        u64::from(n)
    } else {
        naive(n - 1) + naive(n - 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_with_zero_and_one() {
        assert_eq!(naive(0), 0);
        assert_eq!(naive(1), 1);
    }

    #[test]
    fn matches_known_values() {
        assert_eq!(naive(2), 1);
        assert_eq!(naive(10), 55);
        assert_eq!(naive(20), 6765);
        assert_eq!(naive(30), 832_040);
    }

    #[test]
    fn each_value_is_the_sum_of_the_two_before() {
        for n in 2..25 {
            assert_eq!(naive(n), naive(n - 1) + naive(n - 2));
        }
    }
}
