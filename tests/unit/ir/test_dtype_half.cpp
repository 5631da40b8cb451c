#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ir/dtype.h"
#include "ir/half.h"

using namespace qforge;

TEST(DType, OnnxCodesRoundTrip) {
  for (const auto& info : kDTypes) {
    const auto back = dtype_from_onnx(info.onnx_type);
    ASSERT_TRUE(back.has_value()) << info.name;
    EXPECT_EQ(*back, info.dtype) << info.name;
    EXPECT_EQ(dtype_from_name(info.name), info.dtype);
  }
  EXPECT_FALSE(dtype_from_onnx(8).has_value());  // STRING is not an IR dtype
}

TEST(DType, StorageBytesPacksFourBitTypes) {
  EXPECT_EQ(dtype_storage_bytes(DType::I4, 5), 3u);
  EXPECT_EQ(dtype_storage_bytes(DType::U4, 4), 2u);
  EXPECT_EQ(dtype_storage_bytes(DType::F32, 10), 40u);
  EXPECT_FALSE(dtype_storage_bytes(DType::F64, std::numeric_limits<uint64_t>::max() / 4));
}

// Every fp16 bit pattern converts to f32 and back unchanged (NaNs stay NaN).
TEST(Half, F16RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const uint16_t back = f32_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(back)));
    } else {
      ASSERT_EQ(back, h) << "pattern " << h << " value " << f;
    }
  }
}

TEST(Half, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds up to inf
  // 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);     // tie to even -> 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  float tie;
  const uint32_t tie_bits = 0x3f808000u;  // halfway between 0x3f80 and 0x3f81
  std::memcpy(&tie, &tie_bits, 4);
  EXPECT_EQ(f32_to_bf16(tie), 0x3f80);
  const uint32_t above_bits = 0x3f808001u;
  float above;
  std::memcpy(&above, &above_bits, 4);
  EXPECT_EQ(f32_to_bf16(above), 0x3f81);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
}
