// Parameter shapes of a GPT-2-style transformer (GPT-2 medium: 24 layers, d_model 1024, vocab
// 50257, context 1024: about 350M parameters), shared by the benchmarks.
#pragma once

#include <cstddef>
#include <vector>

namespace gpucloud::bench {

/// Element counts of every parameter tensor of a transformer with @p layers layers.
inline std::vector<std::size_t> transformer_parameter_sizes(int layers, std::size_t d = 1024, std::size_t vocab = 50257,
                                                            std::size_t context = 1024) {
  std::vector<std::size_t> sizes = {vocab * d, context * d};  // token and position embeddings
  for (int l = 0; l < layers; ++l) {
    for (std::size_t s : {d, d,              // ln_1 weight, bias
                          3 * d * d, 3 * d,  // attention qkv
                          d * d, d,          // attention projection
                          d, d,              // ln_2
                          4 * d * d, 4 * d,  // mlp fc
                          4 * d * d, d}) {   // mlp projection
      sizes.push_back(s);
    }
  }
  sizes.push_back(d);  // final layer norm
  sizes.push_back(d);
  return sizes;
}

}  // namespace gpucloud::bench
