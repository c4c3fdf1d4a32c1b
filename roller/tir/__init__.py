"""What roller reads from and writes into TVM's TIR, whatever the target: a PrimFunc analysed into an Expr, the named operators, schedule helpers, compiling and the thread pool."""
