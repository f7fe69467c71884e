/* A BLAS whose matrix products are wrong, preloaded (LD_PRELOAD) ahead of
 * OpenBLAS by test_blas_core: the kernels' numerics check must catch it.
 * Single-precision sgemm_/sgemv_ only; every result is off by one. */
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) {
  (void)ta; (void)tb; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb; (void)beta;
  for (int j = 0; j < *n; ++j)
    for (int i = 0; i < *m; ++i)
      c[j * *ldc + i] = 1.0f;
}

void sgemv_(const char* t, const int* m, const int* n, const float* alpha, const float* a, const int* lda,
            const float* x, const int* incx, const float* beta, float* y, const int* incy) {
  (void)alpha; (void)a; (void)lda; (void)x; (void)incx; (void)beta;
  int rows = (*t == 'N' || *t == 'n') ? *m : *n;
  for (int i = 0; i < rows; ++i)
    y[i * *incy] = 1.0f;
}
