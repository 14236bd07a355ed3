set -u
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt; }
for arch in mistral gemma; do
  timeout 265 python3 bench/exact_compile_profile.py $W/prof-$arch --candidates compile-ro,kernelize+exact-ro --batch 1,8 --steps 20 --arch $arch --isolate 1 > $W/prof-$arch.txt 2>&1
  t "profile $arch rc=$?"
done
tar czf $OUT/records.tgz -C $W .
for arch in mistral gemma; do echo "## $arch"; tail -30 $W/prof-$arch.txt; done
cat $W/steps.txt
