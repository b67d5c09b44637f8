// attn: exact, IO-aware attention kernels. Include this for the whole public API.
#pragma once

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/decode.hpp"
#include "attn/dropout.hpp"
#include "attn/info.hpp"
#include "attn/io_model.hpp"
#include "attn/merge.hpp"
#include "attn/online_softmax.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "attn/varlen.hpp"
