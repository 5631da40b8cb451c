// parse_lora_config and resolve_module_scaling: fields, PEFT's pattern rule, refusals.
#include <gtest/gtest.h>

#include <cmath>

#include "importers/lora/lora_config.h"
#include "tests/unit/quant/lora/lora_test_util.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

LoraConfig parse(const std::string& text) { return parse_lora_config(text, "adapter_config.json"); }

void expect_refused(const std::string& extra, ErrorCategory category,
                    const std::vector<std::string>& needles) {
  expect_error([&] { parse(config_json(8, 16, extra)); }, category, needles);
}

}  // namespace

TEST(LoraConfig, ReadsFieldsAndDefaults) {
  const LoraConfig c = parse(config_json(
      16, 32.5,
      "\"use_rslora\": true, \"fan_in_fan_out\": false, \"use_dora\": true, \"lora_bias\": null, "
      "\"bias\": \"lora_only\", \"modules_to_save\": [\"classifier\", \"score\"], "
      "\"target_modules\": [\"q_proj\", \"v_proj\"], \"init_lora_weights\": \"gaussian\", "
      "\"layer_replication\": null, \"target_parameters\": null, \"use_qalora\": false, "
      "\"unknown\": 1"));
  EXPECT_EQ(c.r, 16);
  EXPECT_DOUBLE_EQ(c.lora_alpha, 32.5);
  EXPECT_TRUE(c.use_rslora);
  EXPECT_TRUE(c.use_dora);
  EXPECT_FALSE(c.lora_bias);
  EXPECT_EQ(c.bias, "lora_only");
  EXPECT_EQ(c.modules_to_save, (std::vector<std::string>{"classifier", "score"}));
  EXPECT_EQ(c.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.init_lora_weights, "gaussian");
  const LoraConfig d = parse("{\"peft_type\": \"LORA\", \"target_modules\": \".*proj\"}");
  EXPECT_EQ(d.r, 8);  // PEFT's defaults
  EXPECT_DOUBLE_EQ(d.lora_alpha, 8.0);
  EXPECT_EQ(d.target_modules_regex, ".*proj");
}

TEST(LoraConfig, PatternsFollowPeftMatchRuleFirstKeyWins) {
  const LoraConfig c =
      parse(config_json(8, 16,
                        "\"rank_pattern\": {\"q_proj\": 4, \"model.layers.1.self_attn.q_proj\": 2, "
                        "\"layers\\\\.[2-3]\\\\..*v_proj\": 6}, "
                        "\"alpha_pattern\": {\"self_attn.o_proj\": 3.5}"));
  auto s = resolve_module_scaling(c, "model.layers.1.self_attn.q_proj");
  EXPECT_EQ(s.r, 4);  // "q_proj" is listed first and matches as a suffix
  EXPECT_EQ(s.r_from, "rank_pattern['q_proj']");
  s = resolve_module_scaling(c,
                             "model.layers.1.self_attn.xq_proj");  // "(.*\.)?" needs a dot boundary
  EXPECT_EQ(s.r, 8);
  EXPECT_EQ(s.r_from, "r");
  s = resolve_module_scaling(c, "model.layers.3.self_attn.v_proj");
  EXPECT_EQ(s.r, 6);
  EXPECT_DOUBLE_EQ(s.scaling, 16.0 / 6.0);
  s = resolve_module_scaling(c, "model.layers.0.self_attn.o_proj");
  EXPECT_DOUBLE_EQ(s.alpha, 3.5);
  EXPECT_EQ(s.alpha_from, "alpha_pattern['self_attn.o_proj']");
  EXPECT_DOUBLE_EQ(s.scaling, 3.5 / 8.0);
  const LoraConfig rs = parse(config_json(9, 6, "\"use_rslora\": true"));
  EXPECT_DOUBLE_EQ(resolve_module_scaling(rs, "x").scaling, 2.0);
}

TEST(LoraConfig, BadJsonSaysWhereAndWhatToDo) {
  expect_error([] { parse("{\"peft_type\": \"LORA\", \"r\": 8,,}"); }, ErrorCategory::InvalidInput,
               {"adapter_config.json", "not valid JSON at byte", "save_pretrained"});
  expect_error([] { parse("[1, 2]"); }, ErrorCategory::InvalidInput, {"expected a JSON object"});
  expect_error([] { parse("{\"r\": 8}"); }, ErrorCategory::InvalidInput, {"no peft_type"});
  expect_error([] { parse("{\"peft_type\": \"LORA\", \"lora_alpha\": 1e505}"); },
               ErrorCategory::InvalidInput, {"unreadable JSON"});  // found by fuzz_adapter_config
}

TEST(LoraConfig, RankMustBePositiveInteger) {
  expect_error([] { parse(config_json(0, 16)); }, ErrorCategory::InvalidInput,
               {"r must be a positive integer, not 0"});
  expect_error([] { parse(config_json(-3, 16)); }, ErrorCategory::InvalidInput, {"not -3"});
  expect_error([] { parse("{\"peft_type\": \"LORA\", \"r\": 8.5}"); }, ErrorCategory::InvalidInput,
               {"r must be a positive integer"});
  expect_refused("\"rank_pattern\": {\"q\": 0}", ErrorCategory::InvalidInput,
                 {"rank_pattern['q'] must be a positive integer"});
  expect_error([] { parse("{\"peft_type\": \"LORA\", \"lora_alpha\": \"big\"}"); },
               ErrorCategory::InvalidInput, {"lora_alpha must be a number"});
  expect_refused("\"use_dora\": \"yes\"", ErrorCategory::InvalidInput,
                 {"use_dora must be true or false"});
  expect_refused("\"rank_pattern\": {\"(?P<x>q)\": 2}", ErrorCategory::InvalidInput,
                 {"not a regular expression"});
}

TEST(LoraConfig, RefusesInitialisationsThatChangedTheBase) {
  for (const char* init : {"pissa", "pissa_niter_4", "olora", "corda", "lora_ga"}) {
    expect_refused(std::string("\"init_lora_weights\": \"") + init + "\"",
                   ErrorCategory::Unsupported,
                   {std::string("init_lora_weights='") + init + "'", "changed the base weights",
                    "path_initial_model_for_weight_conversion"});
  }
  expect_refused("\"init_lora_weights\": \"loftq\"", ErrorCategory::Unsupported,
                 {"LoftQ-quantized base"});
  expect_refused("\"init_lora_weights\": \"magic\"", ErrorCategory::InvalidInput,
                 {"'magic' is not a value"});
  EXPECT_EQ(parse(config_json(8, 8, "\"init_lora_weights\": \"mica\"")).init_lora_weights, "mica");
  EXPECT_EQ(parse(config_json(8, 8, "\"init_lora_weights\": false")).init_lora_weights, "false");
}

TEST(LoraConfig, RefusesLayerReplicationOtherTypesAndVariants) {
  expect_refused("\"layer_replication\": [[0, 4], [2, 5]]", ErrorCategory::Unsupported,
                 {"layer_replication is set", "duplicated layers"});
  expect_error([] { parse("{\"peft_type\": \"IA3\"}"); }, ErrorCategory::Unsupported,
               {"peft_type is 'IA3'", "LORA adapters only"});
  expect_refused("\"use_bdlora\": {\"nblocks\": 2}", ErrorCategory::Unsupported,
                 {"use_bdlora", "BD-LoRA"});
  expect_refused("\"trainable_token_indices\": [1, 2]", ErrorCategory::Unsupported,
                 {"trainable tokens"});
  expect_refused("\"alora_invocation_tokens\": [5]", ErrorCategory::Unsupported, {"aLoRA"});
}
