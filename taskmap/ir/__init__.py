"""The tensor IR: types, expressions, statements, functions, task mappings and tools on them."""
from .dtypes import (SCALAR_TYPES, ScalarType, TypeKind, bf16, bool_, f16, f32, f64, i8, i16, i32, i64,
                     promote, scalar_type, u8, u16, u32, u64)
from .expr import (BinOp, Binary, BitCast, Call, CallFunc, Cast, CmpOp, Compare, Const, Expr, Intrinsic, Load,
                   Select, SizeVar, Special, SpecialReg, UnOp, Unary, Var, as_expr, binary, bitcast, blockDim,
                   blockIdx, call, cast, compare, const, gridDim, logical_and, logical_not, logical_or, maximum,
                   minimum, select, threadIdx, var)
from .func import FuncKind, Function, LaunchConfig, Module
from .functor import IRRewriter, IRVisitor, collect, substitute
from .mapping import (ComposedMapping, CustomMapping, MappingLoop, MappingLoopKind, MappingOn, RepeatMapping,
                      SpatialMapping, TaskMapping, auto_map, custom_mapping, repeat, spatial)
from .printer import expr_str, func_str, stmt_str
from .stmt import (Assign, Barrier, BarrierScope, Break, Continue, DeclScalar, DeclTensor, Evaluate, For, ForKind,
                   If, MappingFor, Return, Seq, Stmt, Store, While, seq)
from .types import Layout, MemScope, TensorType, column_major, row_major, tensor_type
