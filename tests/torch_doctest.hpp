// LibTorch's headers bring glog, whose CHECK macros collide with doctest's.
// Tests that use LibTorch include this instead of <doctest/doctest.h>, after
// their LibTorch-using headers: glog's macros go, doctest's take their place.
#pragma once

#include <ATen/ATen.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#undef CHECK_THROWS
#undef CHECK_NOTNULL
#include <doctest/doctest.h>
