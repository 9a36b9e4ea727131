// Tests of linear_int8: being written (issue 17).
