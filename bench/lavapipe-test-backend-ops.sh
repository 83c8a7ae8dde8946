#!/usr/bin/env bash
# test-backend-ops on lavapipe (Vulkan0) for a subset of MUL_MAT and FLASH_ATTN_EXT: the weight types of our models
# (f16, q4_0, q8_0, q4_K) against f32 activations, one token and 16; flash attention with f16 K/V, heads of 64 and 128
# usage: bash bench/lavapipe-test-backend-ops.sh BUILD_DIR/bin OUT_PREFIX  (writes OUT_PREFIX-mul_mat.log, OUT_PREFIX-fa.log)
B=$1; OUT=$2
export GGML_VK_VISIBLE_DEVICES=0
{ time "$B/test-backend-ops" test -b Vulkan0 -o MUL_MAT -p 'type_a=(f16|q4_0|q8_0|q4_K),type_b=f32,m=16,n=(1|16),k=256,bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\],k_v=0,o=1' ; } > "$OUT-mul_mat.log" 2>&1
{ time "$B/test-backend-ops" test -b Vulkan0 -o FLASH_ATTN_EXT -p 'hsk=(64|128),hsv=(64|128),nh=4,nr23=\[1,1\],kv=512,nb=[0-9]+,mask=1,sinks=0,max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,permute=\[0,1,2,3\]' ; } > "$OUT-fa.log" 2>&1
