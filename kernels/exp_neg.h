
/* exp(x) for x <= 0 by Cephes' single-precision polynomial: plain float arithmetic, branch
   free, that the compiler vectorises (with -fno-trapping-math), so the same bits come out of
   the vector body and the scalar tail. */
static inline float exp_neg(float x) {
    const float xc = x < -87.33654f ? -87.33654f : x;
    const float fn = floorf(xc * 1.44269504088896341f + 0.5f);
    const float r = xc - fn * 0.693359375f - fn * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    union { int32_t i; float f; } two = { .i = ((int32_t)fn + 127) << 23 };
    return x < -87.33654f ? 0.0f : y * two.f;
}
