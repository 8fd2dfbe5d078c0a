// Precompiled header: the LibTorch and standard headers nearly every translation unit needs.
// Kept to headers that change rarely; project headers never go here.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/conv.h>
#include <torch/autograd.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
