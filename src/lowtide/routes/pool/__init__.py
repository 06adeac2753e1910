"""What the real-time routes share: a pool that keeps requests in flight (`direct.py`), its
adaptive concurrency (`adaptive.py`), rate limits (`ratelimit.py`), and `RayPool`, a direct
route run on a Ray cluster (`ray.py`).
"""
