// Tests of linear_bf16: being written (issue 17).
